// CPU engine, embedding family: reference variants (lib/ops/embedding.h in float).
#include "embedding.h"

#include "cpu_engine.h"

namespace unet {
namespace {

void temb(const TimestepEmbedding& o) {
  ref::timestep_embedding<float>(o.t.f32(), o.y.f32(), (int)o.y.dim[0], (int)o.y.dim[1]);
}
void emb_add(const EmbeddingAdd& o) {
  ref::embedding_add_fwd<float>(o.labels.i32(), o.table.f32(), o.y.f32(), (int)o.y.dim[0], (int)o.y.dim[1]);
}
void emb_bwd(const EmbeddingBwd& o) {
  ref::embedding_bwd<float>(o.labels.i32(), o.dy.f32(), o.dtable.f32(), (int)o.dy.dim[0],
                            (int)o.dtable.dim[0], (int)o.dy.dim[1]);
}

}  // namespace

void register_embedding_cpu(CpuOps& ops) {
  ops.variants<TimestepEmbedding>().push_back(cpu_ref<TimestepEmbedding, temb>());
  ops.variants<EmbeddingAdd>().push_back(cpu_ref<EmbeddingAdd, emb_add>());
  ops.variants<EmbeddingBwd>().push_back(cpu_ref<EmbeddingBwd, emb_bwd>());
}

}  // namespace unet
