// unet prepare — image folders -> HDF5 dataset (SPEC §1 prepare, §2 dataset).
//
// Files are listed first (recursively, sorted), then decoded and resized by --jobs worker threads
// while the main thread appends the results strictly in list order: the output, the warnings and
// where --limit/--strict stop never depend on thread timing.
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "commands.h"
#include "dataset.h"
#include "image.h"
#include "util.h"

namespace unet {

namespace fs = std::filesystem;

namespace {

struct PrepareArgs {
  std::vector<std::string> dirs;
  std::string out;
  int image_size = 64;
  std::string labels = "none";
  int jobs = 0;
  bool strict = false;
  int64_t limit = 0;
  int64_t max_pixels = (int64_t)kDefaultMaxPixels;
};

struct Item {
  std::string path;  // as shown to the user: DIR/relative
  int64_t label = 0;
  std::string problem;  // non-empty: skip this file with this reason (decided while listing)
};

// Ctrl-C / SIGTERM: stop at the next image and fail like any other error, so the temporary
// output is removed (the default action would leave "<out>.tmp-<pid>" behind).
volatile std::sig_atomic_t g_interrupted = 0;
void on_signal(int) { g_interrupted = 1; }

struct SignalGuard {
  void (*old_int)(int), (*old_term)(int);
  SignalGuard() {
    g_interrupted = 0;
    old_int = std::signal(SIGINT, on_signal);
    old_term = std::signal(SIGTERM, on_signal);
  }
  ~SignalGuard() {
    std::signal(SIGINT, old_int);
    std::signal(SIGTERM, old_term);
  }
};

bool hidden(const fs::path& p) {
  std::string n = p.filename().string();
  return !n.empty() && n[0] == '.';
}

std::string join(const std::string& dir, const std::string& rel) {
  if (!dir.empty() && dir.back() == '/') return dir + rel;
  return dir + "/" + rel;
}

// Every non-hidden regular file under `dir`, as paths relative to it, sorted by bytes. Symlinks
// to files are followed, symlinks to directories are not (no cycles).
std::vector<std::string> list_files(const std::string& dir, const fs::path& skip, std::string* skipped) {
  std::vector<std::string> rel;
  std::error_code ec;
  fs::recursive_directory_iterator it(dir, fs::directory_options::none, ec), end;
  if (ec) throw UserError(dir + ": cannot read directory (" + ec.message() + ")");
  for (; it != end; it.increment(ec)) {
    if (ec) throw UserError(dir + ": cannot read directory (" + ec.message() + ")");
    const fs::path& p = it->path();
    if (hidden(p)) {
      if (it->is_directory(ec) && !it->is_symlink(ec)) it.disable_recursion_pending();
      continue;
    }
    std::error_code e2;
    if (!it->is_regular_file(e2)) continue;
    if (!skip.empty() && fs::weakly_canonical(p, e2) == skip) {
      *skipped = p.string();
      continue;
    }
    rel.push_back(fs::relative(p, dir, e2).generic_string());
    if (e2) rel.back() = p.lexically_relative(dir).generic_string();
  }
  if (ec) throw UserError(dir + ": cannot read directory (" + ec.message() + ")");
  std::sort(rel.begin(), rel.end());
  return rel;
}

// Decodes items on worker threads, hands them out in order. At most `window` items are decoded
// ahead of the consumer, which bounds memory whatever the number of files.
class OrderedDecoder {
 public:
  OrderedDecoder(const std::vector<Item>& items, int size, int jobs, uint64_t max_pixels)
      : items_(items), size_(size), max_pixels_(max_pixels), results_(items.size()), ready_(items.size(), 0) {
    window_ = std::max<size_t>(64, (size_t)jobs * 8);
    for (int j = 0; j < jobs; ++j) threads_.emplace_back([this] { work(); });
  }
  ~OrderedDecoder() {
    {
      std::lock_guard<std::mutex> l(m_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }
  struct Result {
    Image img;
    std::string error;  // non-empty: unreadable, with this message ("<path>: <reason>")
  };
  // Blocks until item i is done and returns it (each index exactly once, in order).
  Result take(size_t i) {
    std::unique_lock<std::mutex> l(m_);
    done_cv_.wait(l, [&] { return ready_[i] != 0; });
    Result r = std::move(results_[i]);
    consumed_ = i + 1;
    l.unlock();
    cv_.notify_all();
    return r;
  }

 private:
  void work() {
    for (;;) {
      size_t i;
      {
        std::unique_lock<std::mutex> l(m_);
        cv_.wait(l, [&] { return stop_ || next_ >= items_.size() || next_ < consumed_ + window_; });
        if (stop_ || next_ >= items_.size()) return;
        i = next_++;
      }
      Result r;
      const Item& it = items_[i];
      if (!it.problem.empty()) {
        r.error = it.path + ": " + it.problem;
      } else {
        try {
          r.img = resize_center_crop(decode_image_file(it.path, max_pixels_), size_);
        } catch (const UserError& e) {
          r.error = e.what();
        } catch (const std::exception& e) {
          r.error = it.path + ": " + e.what();
        }
      }
      {
        std::lock_guard<std::mutex> l(m_);
        results_[i] = std::move(r);
        ready_[i] = 1;
      }
      done_cv_.notify_all();
    }
  }

  const std::vector<Item>& items_;
  int size_;
  uint64_t max_pixels_;
  std::vector<Result> results_;
  std::vector<char> ready_;
  size_t next_ = 0, consumed_ = 0, window_ = 64;
  bool stop_ = false;
  std::mutex m_;
  std::condition_variable cv_, done_cv_;
  std::vector<std::thread> threads_;
};

void run_prepare(const PrepareArgs& a) {
  int jobs = a.jobs > 0 ? a.jobs : (int)std::max(1u, std::thread::hardware_concurrency());
  for (const auto& d : a.dirs) {
    std::error_code ec;
    if (!fs::exists(d, ec)) throw UserError(d + ": no such directory");
    if (!fs::is_directory(d, ec)) throw UserError(d + ": not a directory");
  }
  check_writable_dir_for(a.out);  // fail before the work, not after
  std::error_code ec;
  fs::path out_canon = fs::weakly_canonical(a.out, ec);
  const bool subdirs = a.labels == "subdirs";

  // List every file; with --labels subdirs the class is the first path component.
  std::vector<Item> items;
  std::set<std::string> classes;
  std::vector<std::pair<size_t, std::string>> class_of;  // item index -> class name
  std::string out_in_input;                              // the output's path when it lies among the inputs
  for (const auto& d : a.dirs) {
    for (const auto& rel : list_files(d, out_canon, &out_in_input)) {
      Item it;
      it.path = join(d, rel);
      size_t slash = rel.find('/');
      if (subdirs) {
        if (slash == std::string::npos) {
          it.problem = "not inside a class subfolder (--labels subdirs)";
        } else {
          classes.insert(rel.substr(0, slash));
          class_of.emplace_back(items.size(), rel.substr(0, slash));
        }
      }
      items.push_back(std::move(it));
    }
  }
  // The output among the inputs: fine when it is an earlier output (HDF5), never an image.
  if (!out_in_input.empty()) {
    char sig[8] = {0};
    std::FILE* f = std::fopen(out_in_input.c_str(), "rb");
    const bool hdf5 = f && std::fread(sig, 1, 8, f) == 8 && std::memcmp(sig, "\x89HDF\r\n\x1a\n", 8) == 0;
    if (f) std::fclose(f);
    if (!hdf5)
      throw UserError(a.out + ": is the input file " + out_in_input + "; refusing to overwrite an input");
  }
  std::vector<std::string> class_names(classes.begin(), classes.end());
  {
    std::map<std::string, int64_t> index;
    for (size_t i = 0; i < class_names.size(); ++i) index[class_names[i]] = (int64_t)i;
    for (auto& [i, name] : class_of) items[i].label = index[name];
  }
  std::string where =
      a.dirs.size() == 1 ? a.dirs[0] : a.dirs[0] + " (and " + std::to_string(a.dirs.size() - 1) + " more)";
  if (items.empty()) throw UserError(where + ": no files found (expected PNG or JPEG images)");
  // -o onto one of the inputs (the same file, also through a hard link) would destroy it.
  if (fs::exists(a.out, ec))
    for (const Item& it : items) check_not_input(a.out, it.path, "input image");

  SignalGuard signals;
  DatasetWriter writer(a.out, a.image_size, subdirs, class_names);
  int64_t skipped = 0;
  const int64_t want =
      a.limit > 0 ? std::min<int64_t>(a.limit, (int64_t)items.size()) : (int64_t)items.size();
  Progress progress("prepare", (long)want, "img");
  const bool tty = stderr_is_tty();
  {
    OrderedDecoder dec(items, a.image_size, std::min<int>(jobs, (int)items.size()), (uint64_t)a.max_pixels);
    for (size_t i = 0; i < items.size() && writer.count() < want; ++i) {
      if (g_interrupted) {
        if (tty) std::fprintf(stderr, "\n");
        throw UserError("interrupted; " + a.out + " not written");
      }
      OrderedDecoder::Result r = dec.take(i);
      if (!r.error.empty()) {
        if (a.strict) throw UserError(r.error + " (--strict)");
        ++skipped;
        std::fprintf(stderr, "%sunet: skipping %s\n", tty ? "\r\033[K" : "", one_line(r.error).c_str());
        continue;
      }
      writer.append(r.img.rgb.data(), items[i].label);
      progress.update((long)writer.count());
    }
  }
  progress.finish();
  if (writer.count() == 0)
    throw UserError(where + ": no readable images (" + std::to_string(skipped) + " file" +
                    (skipped == 1 ? "" : "s") + " skipped)");
  writer.commit();
  std::string msg = "wrote " + std::to_string(writer.count()) + " image" + (writer.count() == 1 ? "" : "s");
  if (subdirs)
    msg += " (" + std::to_string(class_names.size()) + " class" + (class_names.size() == 1 ? "" : "es") + ")";
  msg += " to " + a.out;
  if (skipped) msg += "; skipped " + std::to_string(skipped) + " unreadable file" + (skipped == 1 ? "" : "s");
  std::printf("%s\n", msg.c_str());
}

}  // namespace

void register_prepare(CLI::App& app) {
  auto a = std::make_shared<PrepareArgs>();
  auto* sub = app.add_subcommand("prepare", "image folders -> HDF5 dataset");
  sub->footer(
      "Reads every file under each DIR (recursively; hidden files/folders skipped; symlinked folders\n"
      "not followed), in byte order of the path relative to DIR, and keeps the PNG and JPEG images\n"
      "(detected by content). Other and corrupt files are skipped with a warning, or stop the run with\n"
      "--strict.\n"
      "Each image becomes 8-bit RGB: gray is replicated, 16-bit samples keep their high byte, and\n"
      "alpha is composited over black (c * a / 255). Then, as guided-diffusion's center_crop_arr:\n"
      "halve with a box filter while the short side is >= 2x the size, resize (bicubic, antialiased,\n"
      "PIL-exact) so the short side equals --image-size, and crop the center square.\n"
      "--labels subdirs: the class is the first-level subfolder (names sorted -> 0, 1, ...; stored as\n"
      "labels.attrs['class_names']); files directly in DIR are skipped with a warning.\n"
      "Output: images uint8 [N,S,S,3], labels int64 [N]; see SPEC §2.\n"
      "Example: unet prepare photos/ -o data.h5 --image-size 64 --labels subdirs");
  sub->add_option("dirs", a->dirs, "image folders")->required()->type_name("DIR");
  sub->add_option("-o,--output", a->out, "dataset to write (.h5)")->required();
  sub->add_option("--image-size", a->image_size, "output side length in pixels, 1 to 4096 (default 64)")
      ->check(int_range(1, 4096));
  sub->add_option("--labels", a->labels, "none | subdirs (class = first-level subfolder)")
      ->check(CLI::IsMember({"none", "subdirs"}));
  sub->add_option("--jobs", a->jobs, "decoding threads, 1 to 1024 (default: all cores)")
      ->check(int_range(1, 1024));
  sub->add_flag("--strict", a->strict, "stop at the first unreadable file");
  sub->add_option("--limit", a->limit, "stop after N images")->check(int_range(1, INT64_MAX));
  sub->add_option("--max-pixels", a->max_pixels,
                  "skip (or with --strict refuse) images of more than N pixels before decoding them "
                  "(default 178956970, PIL's decompression-bomb limit)")
      ->check(int_range(1, (int64_t)1 << 40));
  sub->callback([a] { run_prepare(*a); });
}

}  // namespace unet
