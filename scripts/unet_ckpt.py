"""Exchange `unet` HDF5 checkpoints with PyTorch (SPEC §2).

    from unet_ckpt import load_checkpoint, save_checkpoint
    model, flags = load_checkpoint("ckpt.h5")              # strict load of model/ (or ema/)
    save_checkpoint(model, flags, "from_torch.h5")         # `unet sample from_torch.h5` loads it

Layout: model/<name> (and ema/<name>) float32 datasets named and shaped exactly as
UNetModel.state_dict(); root attributes format="unet-checkpoint", version=1 and every model /
diffusion flag under its guided-diffusion name (booleans stored as int64 0/1, lists as int64
arrays, dropout float64, noise_schedule string). Optional optimizer/ and state groups written by
`unet train` are ignored here.

Classifier checkpoints (`unet init --classifier`, `unet train-classifier`: guided-diffusion's
EncoderUNetModel, scripts/classifier_torch.py) have the same groups, format="unet-classifier" and
the classifier's flags as attributes (classifier_width, classifier_depth, ...):
    clf, flags = load_classifier_checkpoint("cls.h5")
    save_classifier_checkpoint(clf, flags, "cls.h5")

Command line:
    python3 scripts/unet_ckpt.py CKPT.h5                       describe a checkpoint
    python3 scripts/unet_ckpt.py import FILE.pt [--preset NAME] [model flags] -o OUT.h5
    python3 scripts/unet_ckpt.py import 64x64_classifier.pt [--classifier] [--preset imagenet64]
                                 [classifier flags] -o OUT.h5
    python3 scripts/unet_ckpt.py export CKPT.h5 -o FILE.pt [--ema | --model]

`import` converts a plain state_dict as OpenAI released them (guided-diffusion's .pt files) into a
unet checkpoint, strictly checked against the model of the preset + flags (without a preset, the
flags resolve as guided-diffusion's scripts resolve them, so its MODEL_FLAGS paste as they are); `export` writes a
checkpoint's weights as such a state_dict (float32), which guided-diffusion's scripts load as is.
"""

import argparse
import os
import stat
import sys
from collections import Counter, OrderedDict

import h5py
import numpy as np
import torch

from classifier_torch import (CLASSIFIER_DEFAULTS, CLASSIFIER_PRESETS, GD_MULT, classifier_state_dict_shapes,
                              create_classifier, normalize_classifier_flags, write_classifier_attrs)
from classifier_torch import FORMAT as CLASSIFIER_FORMAT
from unet_torch import (CFG_FLAGS, DEFAULT_FLAGS, OBJECTIVE_FLAGS, PRESETS, create_model, normalize_flags,
                        state_dict_shapes)

FORMAT = "unet-checkpoint"
VERSION = 1


def _attr_str(v):
    if isinstance(v, bytes):
        return v.decode()
    if isinstance(v, np.ndarray) and v.shape == ():
        return _attr_str(v[()])
    return str(v)


def read_flags(f):
    """Model/diffusion flags from the root attributes of an open h5py File (plain Python types)."""
    fmt = _attr_str(f.attrs.get("format", ""))
    if fmt == CLASSIFIER_FORMAT:
        raise ValueError(f"{f.filename}: is a classifier checkpoint (format {fmt!r}), not a diffusion model")
    if fmt != FORMAT:
        raise ValueError(f"{f.filename}: not a unet checkpoint (format attribute is {fmt!r})")
    missing = [k for k in DEFAULT_FLAGS if k not in f.attrs and k not in OBJECTIVE_FLAGS + CFG_FLAGS]
    if missing:
        raise ValueError(f"{f.filename}: missing attribute(s) {', '.join(missing)}")
    return normalize_flags({k: f.attrs[k] for k in DEFAULT_FLAGS if k in f.attrs})


def read_classifier_flags(f):
    """Classifier flags from the root attributes of an open h5py File (plain Python types)."""
    fmt = _attr_str(f.attrs.get("format", ""))
    if fmt != CLASSIFIER_FORMAT:
        raise ValueError(f"{f.filename}: not a unet classifier checkpoint (format attribute is {fmt!r})")
    return normalize_classifier_flags({k: f.attrs[k] for k in CLASSIFIER_DEFAULTS if k in f.attrs})


def is_classifier_file(f):
    return _attr_str(f.attrs.get("format", "")) == CLASSIFIER_FORMAT


def read_state_dict(group):
    """{name: tensor} from an h5py group of datasets (PyTorch layout)."""
    return {k: torch.from_numpy(np.asarray(v[()], dtype=np.float32)) for k, v in group.items()}


def load_checkpoint(path, use_ema=False, map_location="cpu"):
    """Returns (model, flags): the UNet built from the root attributes with model/ (or ema/ when
    use_ema and present) loaded strictly. The model is float32, in eval mode."""
    with h5py.File(path, "r") as f:
        flags = read_flags(f)
        group = "ema" if use_ema and "ema" in f else "model"
        sd = read_state_dict(f[group])
    model = create_model(flags)
    model.load_state_dict(sd, strict=True)
    return model.to(map_location).eval(), flags


def load_classifier_checkpoint(path, use_ema=False, map_location="cpu"):
    """Returns (classifier, flags), model/ (or ema/) loaded strictly; float32, eval mode."""
    with h5py.File(path, "r") as f:
        flags = read_classifier_flags(f)
        group = "ema" if use_ema and "ema" in f else "model"
        sd = read_state_dict(f[group])
    model = create_classifier(flags)
    model.load_state_dict(sd, strict=True)
    return model.to(map_location).eval(), flags


def save_classifier_checkpoint(model, flags, path, ema=None):
    """Writes a classifier (or its state dict) with its flags as `unet init --classifier` does."""
    sd = model.state_dict() if hasattr(model, "state_dict") else model
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with h5py.File(tmp, "w") as f:
            write_classifier_attrs(f, flags)
            _write_group(f, "model", sd)
            if ema is not None:
                _write_group(f, "ema", ema.state_dict() if hasattr(ema, "state_dict") else ema)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def _write_flags(f, flags):
    fl = normalize_flags(flags)
    f.attrs["format"] = FORMAT
    f.attrs["version"] = np.int64(VERSION)
    for k, v in fl.items():
        if k in CFG_FLAGS and not fl["null_class"]:
            continue  # as `unet init`: only a model with a null class carries these
        if isinstance(v, bool):
            f.attrs[k] = np.int64(int(v))
        elif isinstance(v, int):
            f.attrs[k] = np.int64(v)
        elif isinstance(v, float):
            f.attrs[k] = np.float64(v)
        elif isinstance(v, tuple):
            # int64 like `unet init`; float64 only for fractional multipliers (imagenet512's 0.5)
            whole = all(float(x).is_integer() for x in v)
            f.attrs[k] = np.asarray(v, dtype=np.int64 if whole else np.float64)
        else:
            f.attrs[k] = str(v)
    return fl


def _write_group(f, name, sd):
    g = f.create_group(name)
    for k, v in sd.items():
        g.create_dataset(k, data=v.detach().to("cpu", torch.float32).contiguous().numpy())


def save_checkpoint(model, flags, path, ema=None):
    """Writes `model` (and optionally an EMA model or state dict) in the SPEC §2 layout. `flags`
    are the model flags (missing ones take the seed64 defaults). The file is written under a
    temporary name and renamed into place."""
    import os

    sd = model.state_dict() if hasattr(model, "state_dict") else model
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with h5py.File(tmp, "w") as f:
            _write_flags(f, flags)
            _write_group(f, "model", sd)
            if ema is not None:
                _write_group(f, "ema", ema.state_dict() if hasattr(ema, "state_dict") else ema)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


# ---- `unet init`'s generator, transcribed (lib/init.cpp) -------------------------------------
_M64 = (1 << 64) - 1


def _splitmix64(x):
    """splitmix64 on a numpy uint64 array (wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def _fnv1a(s):
    h = 0xcbf29ce484222325
    for c in s.encode():
        h = ((h ^ c) * 0x100000001b3) & _M64
    return h


def _unit(key, idx):
    """Uniform [0,1) doubles from the top 53 bits of splitmix64(key ^ splitmix64(idx))."""
    bits = _splitmix64(np.uint64(key) ^ _splitmix64(idx.astype(np.uint64)))
    return (bits >> np.uint64(11)).astype(np.float64) * 2.0 ** -53


def unet_init_state_dict(flags, seed=0):
    """The weights `unet init --seed SEED` writes for these flags, recomputed in numpy: element i
    (PyTorch order) of tensor `name` depends only on (seed, name, i). Uniform tensors are exact;
    normals may differ from the C++ ones in the last bit (libm log/cos/sin)."""
    model = create_model(flags)
    out = {}
    for name, t in model.state_dict().items():
        n = t.numel()
        key = int(_splitmix64(np.uint64(seed) ^ _splitmix64(np.uint64(_fnv1a(name)))))
        module = model.get_submodule(name.rsplit(".", 1)[0])
        zero = any(z in name for z in (".out_layers.3.", ".proj_out.")) or name.startswith("out.2.")
        if zero:
            v = np.zeros(n, np.float32)
        elif isinstance(module, torch.nn.GroupNorm):
            v = np.ones(n, np.float32) if name.endswith(".weight") else np.zeros(n, np.float32)
        elif isinstance(module, torch.nn.Embedding):
            k = np.arange((n + 1) // 2, dtype=np.uint64)
            u1 = 1.0 - _unit(key, 2 * k)
            u2 = _unit(key, 2 * k + 1)
            r = np.sqrt(-2.0 * np.log(u1))
            z = np.stack([r * np.cos(2 * np.pi * u2), r * np.sin(2 * np.pi * u2)], axis=1).reshape(-1)[:n]
            v = z.astype(np.float32)
        else:
            w = module.weight
            fan_in = int(np.prod(w.shape[1:]))
            bound = 1.0 / np.sqrt(float(fan_in))
            v = (bound * (2.0 * _unit(key, np.arange(n, dtype=np.uint64)) - 1.0)).astype(np.float32)
        out[name] = torch.from_numpy(v.reshape(tuple(t.shape)))
    return out


# ---- import / export of guided-diffusion .pt state_dicts --------------------------------------
class CliError(Exception):
    """A user error: printed as one line, exit status 1."""


def _shape(t):
    return "x".join(str(d) for d in t) if t else "scalar"


def _few(items, n=3):
    return ", ".join(items[:n]) + (f", ... ({len(items) - n} more)" if len(items) > n else "")


def compare_state_dict(got, want):
    """got: {name: tensor}, want: [(name, shape)]. Returns '' when they match exactly (names,
    shapes, floating-point tensors), else a one-line list of what is missing / unexpected /
    misshaped."""
    want_d = dict(want)
    missing = [k for k, _ in want if k not in got]
    unexpected = [k for k in got if k not in want_d]
    bad = []
    for k, v in got.items():
        if k not in want_d:
            continue
        if not torch.is_tensor(v) or not v.is_floating_point():
            bad.append(f"{k} ({type(v).__name__ if not torch.is_tensor(v) else v.dtype}, not a float tensor)")
        elif tuple(v.shape) != want_d[k]:
            bad.append(f"{k} ({_shape(tuple(v.shape))}, expected {_shape(want_d[k])})")
    parts = []
    if missing:
        parts.append(f"{len(missing)} missing ({_few(missing)})")
    if unexpected:
        parts.append(f"{len(unexpected)} unexpected ({_few(unexpected)})")
    if bad:
        parts.append(f"{len(bad)} misshaped ({_few(bad)})")
    return "; ".join(parts)


def matching_presets(got, classifier=False):
    """Presets whose names and shapes `got` has (shapes cannot tell the attention order, the noise
    schedule or dropout apart: imagenet256-uncond and lsun256 look the same)."""
    if classifier:
        return [p for p in CLASSIFIER_PRESETS if not compare_state_dict(got, classifier_state_dict_shapes(preset=p))]
    return [p for p in PRESETS if not compare_state_dict(got, state_dict_shapes(preset=p))]


def looks_like_classifier(sd):
    """guided-diffusion's classifier state_dict (EncoderUNetModel, attention pool)."""
    return "out.2.positional_embedding" in sd or "out.2.c_proj.weight" in sd


def _str2bool(s):
    v = str(s).lower()
    if v in ("1", "true", "t", "yes", "y", "on"):  # guided-diffusion's str2bool, plus on/off
        return True
    if v in ("0", "false", "f", "no", "n", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, not {s!r}")


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line and exit 1, like `unet`, instead of usage + exit 2
        raise CliError(f"{message} (see --help)")


def _add_model_flags(p):
    """guided-diffusion's flag names, spelled --image-size or --image_size; booleans as a bare
    flag, --flag=false, or guided-diffusion's --flag True, so its MODEL_FLAGS paste as they are."""
    g = p.add_argument_group("model flags (override the preset)")
    for k, v in DEFAULT_FLAGS.items():
        names = ["--" + k.replace("_", "-")] + (["--" + k] if "_" in k else [])
        if isinstance(v, bool):
            g.add_argument(*names, dest=k, nargs="?", const=True, type=_str2bool, metavar="BOOL")
        elif k == "noise_schedule":
            g.add_argument(*names, dest=k, choices=("linear", "cosine"))
        else:
            g.add_argument(*names, dest=k, type={int: int, float: float}.get(type(v), str))
    for k in ("use_fp16", "use_checkpoint"):  # run-time choices in guided-diffusion: no effect on weights
        g.add_argument("--" + k.replace("_", "-"), "--" + k, dest=k, nargs="?", const=True, type=_str2bool,
                       metavar="BOOL", help=argparse.SUPPRESS)


def _add_classifier_flags(p):
    """create_classifier's flags (--classifier-width or --classifier_width, ...); --image-size,
    --in-channels, --num-classes, --diffusion-steps and --noise-schedule are the model flags'."""
    g = p.add_argument_group("classifier flags (with --classifier or a classifier state_dict)")
    g.add_argument("--classifier", action="store_true",
                   help="the file is a classifier (guided-diffusion's EncoderUNetModel); also detected from its names")
    for k, v in CLASSIFIER_DEFAULTS.items():
        if not k.startswith("classifier_"):
            continue
        names = ["--" + k.replace("_", "-"), "--" + k]
        if isinstance(v, bool):
            g.add_argument(*names, dest=k, nargs="?", const=True, type=_str2bool, metavar="BOOL")
        else:
            g.add_argument(*names, dest=k, type=int if isinstance(v, int) else str)
    g.add_argument("--classifier-use-fp16", "--classifier_use_fp16", dest="classifier_use_fp16", nargs="?",
                   const=True, type=_str2bool, metavar="BOOL", help=argparse.SUPPRESS)


def _check_flags(fl):
    """The rules of unet's ModelConfig::validate that PyTorch would not enforce by itself, so no
    checkpoint is written that `unet` then refuses."""
    levels = len(fl["channel_mult"])
    if levels == 0 or fl["image_size"] % (1 << (levels - 1)):
        raise CliError(f"invalid model flags: image_size {fl['image_size']} is not divisible by 2^{levels - 1}")
    sizes = [fl["image_size"] >> i for i in range(levels)]
    for r in fl["attention_resolutions"]:
        if r not in sizes:
            raise CliError(f"invalid model flags: attention resolution {r} is not a feature-map size {sizes}")
    for m in fl["channel_mult"]:
        if not (m > 0 and int(m * fl["num_channels"]) % 32 == 0 and int(m * fl["num_channels"]) > 0):
            raise CliError(f"invalid model flags: channel_mult {m} x num_channels {fl['num_channels']} is not a "
                           "positive multiple of 32 (GroupNorm's groups)")
    if fl["noise_schedule"] == "linear" and fl["diffusion_steps"] <= 20:
        raise CliError("invalid model flags: diffusion_steps must be > 20 for the linear schedule")
    if fl["diffusion_steps"] < 2 or not 0 <= fl["dropout"] < 1:
        raise CliError("invalid model flags: diffusion_steps < 2 or dropout outside [0, 1)")
    if fl["null_class"] and not fl["class_cond"]:
        raise CliError("invalid model flags: null_class needs class_cond (the null class is a row of label_emb)")
    if not 0 <= fl["class_dropout"] < 1 or (fl["class_dropout"] > 0 and not fl["null_class"]):
        raise CliError("invalid model flags: class_dropout must be in [0, 1) and needs null_class")


def _kind(mode):
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def _check_input(path):
    """An input file: one line for a missing file, a link to nothing, a name the system refuses, a
    directory or a special file (as `unet` says them)."""
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        if os.path.islink(path):
            raise CliError(f"{path}: a broken symbolic link (to {os.readlink(path)}, which does not exist)")
        raise CliError(f"{path}: no such file")
    except OSError as e:
        raise CliError(f"{path}: cannot open ({e.strerror})")
    if not stat.S_ISREG(st.st_mode):
        raise CliError(f"{path}: is {_kind(st.st_mode)}, not a regular file")


def _check_output(out, inp):
    d = os.path.dirname(os.path.abspath(out))
    try:
        found = stat.S_ISDIR(os.stat(d).st_mode)
    except (FileNotFoundError, NotADirectoryError):
        found = False
    except OSError as e:  # a name too long, ...
        raise CliError(f"{out}: cannot write ({e.strerror})")
    if not found:
        raise CliError(f"{out}: directory {d} does not exist")
    try:
        st = os.stat(out)
    except FileNotFoundError:
        st = None
    except OSError as e:
        raise CliError(f"{out}: cannot write ({e.strerror})")
    if st is not None:
        if stat.S_ISDIR(st.st_mode):
            raise CliError(f"{out}: is a directory")
        if not stat.S_ISREG(st.st_mode):
            raise CliError(f"{out}: is {_kind(st.st_mode)}, not a regular file; refusing to replace it with an output")
        if os.path.exists(inp) and os.path.samefile(out, inp):
            raise CliError(f"{out}: the output would overwrite the input")
    # written as "<name>.tmp-<pid>" first (10 digits: any pid)
    name_max, n = os.pathconf(d, "PC_NAME_MAX"), len(os.fsencode(os.path.basename(out)))
    if name_max > 0 and n + 15 > name_max:
        raise CliError(f"{out}: file name too long ({n} bytes; an output's name may have {name_max - 15}, "
                       "as it is written under a temporary name first)")


def _write(out, save):
    """save(): the file written, or one line naming it and the system's reason (a full disk, ...)."""
    try:
        save()
    except (OSError, RuntimeError) as e:
        msg = getattr(e, "strerror", None) or (str(e).strip().splitlines() or [type(e).__name__])[-1]
        raise CliError(f"{out}: cannot write ({msg})")


def _flags_summary(fl):
    return " ".join(f"{k}={','.join(str(x) for x in v) if isinstance(v, tuple) else v}" for k, v in fl.items())


_GD_MULT = {512: (0.5, 1, 1, 2, 2, 4, 4), 256: (1, 1, 2, 2, 4, 4), 128: (1, 1, 2, 3, 4), 64: (1, 2, 3, 4)}
# guided-diffusion's model_and_diffusion_defaults() (the model's part; in_channels and
# num_classes are fixed in its create_model).
_GD_DEFAULTS = dict(image_size=64, in_channels=3, num_channels=128, num_res_blocks=2, num_heads=4,
                    num_head_channels=-1, attention_resolutions="16,8", dropout=0.0, class_cond=False,
                    num_classes=1000, use_scale_shift_norm=True, resblock_updown=False,
                    use_new_attention_order=False, learn_sigma=False, diffusion_steps=1000, noise_schedule="linear")


def import_flags(a):
    """(flags, description) for `import`: the preset + explicit flags, or without --preset the flags
    resolved as guided-diffusion's scripts resolve them (its defaults, channel_mult by image size),
    so a model's MODEL_FLAGS alone describe it -- unet's own defaults differ in ways the shapes
    cannot show (attention order, heads)."""
    explicit = {k: getattr(a, k) for k in DEFAULT_FLAGS if getattr(a, k) is not None}
    given = f" with {', '.join(sorted(explicit))}" if explicit else ""
    if a.preset:
        return normalize_flags(explicit, preset=a.preset), f"preset {a.preset}{given}"
    f = dict(_GD_DEFAULTS, **explicit)
    if "channel_mult" not in explicit:
        if f["image_size"] not in _GD_MULT:
            raise CliError(f"guided-diffusion has no channel_mult for image_size {f['image_size']}: "
                           "give --channel-mult")
        f["channel_mult"] = _GD_MULT[f["image_size"]]
    return normalize_flags(f), f"guided-diffusion's defaults{given}"


def import_classifier_flags(a):
    """(flags, description) of a classifier import: the classifier preset (default: guided-diffusion's
    classifier_defaults(), which is also its flags' resolution) + explicit flags."""
    shared = ("image_size", "in_channels", "num_classes", "diffusion_steps", "noise_schedule")
    stray = [k for k in DEFAULT_FLAGS if k not in shared and getattr(a, k) is not None]
    if stray:
        raise CliError(f"--{stray[0].replace('_', '-')} is a diffusion-model flag; a classifier takes --classifier-* "
                       "flags (see --help)")
    explicit = {k: getattr(a, k) for k in CLASSIFIER_DEFAULTS if getattr(a, k, None) is not None}
    given = f" with {', '.join(sorted(explicit))}" if explicit else ""
    preset = a.preset or "default"
    if preset not in CLASSIFIER_PRESETS:
        raise CliError(f"--preset {preset} is not a classifier preset ({', '.join(CLASSIFIER_PRESETS)})")
    f = dict(CLASSIFIER_PRESETS[preset], **explicit)
    if "classifier_channel_mult" not in explicit and "image_size" in explicit and "image_size" not in \
            CLASSIFIER_PRESETS[preset]:
        f["classifier_channel_mult"] = ()  # by the image size given
    try:
        fl = normalize_classifier_flags(f)
    except ValueError as e:
        raise CliError(f"invalid classifier flags: {e}")
    what = (f"classifier preset {preset}" if a.preset else "guided-diffusion's classifier defaults") + given
    return fl, what


def _check_classifier_flags(fl):
    if fl["classifier_pool"] != "attention":
        raise CliError(f"classifier_pool {fl['classifier_pool']!r}: unet's classifier has the attention pool only "
                       "(guided-diffusion's default, used by all its released classifiers)")
    levels = len(fl["classifier_channel_mult"])
    if fl["image_size"] % (1 << (levels - 1)):
        raise CliError(f"invalid classifier flags: image_size {fl['image_size']} is not divisible by 2^{levels - 1}")
    for m in fl["classifier_channel_mult"]:
        c = int(m * fl["classifier_width"])
        if c <= 0 or c % 32 or c % fl["classifier_num_head_channels"]:
            raise CliError(f"invalid classifier flags: {c} channels (mult {m}) are not a positive multiple of 32 and "
                           f"of classifier_num_head_channels {fl['classifier_num_head_channels']}")


def cmd_import_classifier(a, sd):
    flags, what = import_classifier_flags(a)
    _check_classifier_flags(flags)
    try:
        want = classifier_state_dict_shapes(flags)
    except (AssertionError, ValueError) as e:
        raise CliError(f"invalid classifier flags ({what}): {e or 'inconsistent values'}")
    problem = compare_state_dict(sd, want)
    if problem:
        m = [p for p in matching_presets(sd, classifier=True) if p != a.preset]
        hint = f"; its names and shapes match classifier preset {' or '.join(m)}" if m else ""
        raise CliError(f"{a.input}: does not match the classifier of {what}: {problem}{hint}")
    dtypes = Counter(str(v.dtype).replace("torch.", "") for v in sd.values())
    model = OrderedDict((k, sd[k].detach().to(torch.float32).contiguous()) for k, _ in want)
    _write(a.output, lambda: save_classifier_checkpoint(model, flags, a.output))
    n = sum(v.numel() for v in model.values())
    conv = ", ".join(f"{c} {t}" for t, c in dtypes.items() if t != "float32")
    print(f"{a.output}: classifier, {what}, {len(model)} tensors, {n / 1e6:.2f} M parameters in model/ (float32"
          + (f"; converted {conv} tensors" if conv else "") + ")")
    return 0


def _load_state_dict(a):
    _check_input(a.input)
    try:
        sd = torch.load(a.input, map_location="cpu", weights_only=True)
    except Exception as e:  # pickle/zip errors, or objects a weights_only load refuses
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CliError(f"{a.input}: cannot read as a PyTorch state_dict ({msg})")
    if not isinstance(sd, dict) or not all(isinstance(k, str) and torch.is_tensor(v) for k, v in sd.items()):
        kind = type(sd).__name__
        if isinstance(sd, dict):
            first = next(k for k, v in sd.items() if not torch.is_tensor(v))
            kind = f"dict with non-tensor entries, e.g. {first!r}"
        raise CliError(f"{a.input}: not a plain state_dict (name -> tensor) but a {kind}")
    return sd


def cmd_import(a):
    """A diffusion model's state_dict, or a classifier's (--classifier, classifier flags or preset, or
    guided-diffusion's classifier names in the file)."""
    classifier = a.classifier or any(getattr(a, k, None) is not None for k in CLASSIFIER_DEFAULTS
                                     if k.startswith("classifier_")) or (a.preset and a.preset not in PRESETS)
    sd = None
    if not classifier and os.path.isfile(a.input):
        _check_output(a.output, a.input)
        sd = _load_state_dict(a)
        classifier = looks_like_classifier(sd)
    if classifier:
        _check_output(a.output, a.input)
        return cmd_import_classifier(a, sd if sd is not None else _load_state_dict(a))
    flags, what = import_flags(a)
    _check_flags(flags)
    try:
        want = state_dict_shapes(flags)
    except (AssertionError, ValueError) as e:  # heads not dividing channels, GroupNorm groups, ...
        raise CliError(f"invalid model flags ({what}): {e or 'inconsistent values'}")
    _check_output(a.output, a.input)
    sd = sd if sd is not None else _load_state_dict(a)
    problem = compare_state_dict(sd, want)
    if problem:
        m = [p for p in matching_presets(sd) if p != a.preset]
        hint = f"; its names and shapes match preset {' or '.join(m)}" if m else ""
        raise CliError(f"{a.input}: does not match the model of {what}: {problem}{hint}")
    dtypes = Counter(str(v.dtype).replace("torch.", "") for v in sd.values())
    # float16/bfloat16 -> float32 is exact
    model = OrderedDict((k, sd[k].detach().to(torch.float32).contiguous()) for k, _ in want)
    _write(a.output, lambda: save_checkpoint(model, flags, a.output))
    n = sum(v.numel() for v in model.values())
    conv = ", ".join(f"{c} {t}" for t, c in dtypes.items() if t != "float32")
    print(f"{a.output}: {what}, {len(model)} tensors, {n / 1e6:.2f} M parameters in model/ (float32"
          + (f"; converted {conv} tensors" if conv else "") + ")")
    return 0


def guided_diffusion_flags(flags):
    """(MODEL_FLAGS for guided-diffusion's scripts, [notes on what they cannot express])."""
    f = normalize_flags(flags)
    b = lambda v: "True" if v else "False"  # noqa: E731
    out = {"attention_resolutions": ",".join(str(r) for r in f["attention_resolutions"]),
           "class_cond": b(f["class_cond"]), "diffusion_steps": f["diffusion_steps"], "dropout": f["dropout"],
           "image_size": f["image_size"], "learn_sigma": b(f["learn_sigma"]),
           "noise_schedule": f["noise_schedule"], "num_channels": f["num_channels"],
           "num_head_channels": f["num_head_channels"], "num_heads": f["num_heads"],
           "num_res_blocks": f["num_res_blocks"], "resblock_updown": b(f["resblock_updown"]),
           "use_new_attention_order": b(f["use_new_attention_order"]),
           "use_scale_shift_norm": b(f["use_scale_shift_norm"])}
    notes = []
    if f["channel_mult"] != _GD_MULT.get(f["image_size"]):
        if all(isinstance(m, int) for m in f["channel_mult"]):
            out["channel_mult"] = ",".join(str(m) for m in f["channel_mult"])
        else:
            notes.append(f"channel_mult {f['channel_mult']} (guided-diffusion's flag takes integers only)")
    if not f["attention_resolutions"]:
        notes.append("no attention resolutions (guided-diffusion's flag cannot be empty)")
    if f["in_channels"] != 3:
        notes.append(f"in_channels {f['in_channels']} (guided-diffusion's create_model fixes 3)")
    if f["class_cond"] and f["num_classes"] != 1000:
        notes.append(f"num_classes {f['num_classes']} (guided-diffusion fixes 1000)")
    if f["class_cond"] and f["null_class"]:
        notes.append(f"the null class: label_emb has num_classes + 1 = {f['num_classes'] + 1} rows (guided-diffusion "
                     f"fixes 1000 classes; build its UNetModel with num_classes={f['num_classes'] + 1})")
    return " ".join(f"--{k} {v}" for k, v in sorted(out.items())), notes


def guided_diffusion_classifier_flags(flags):
    """(CLASSIFIER_FLAGS for guided-diffusion's scripts, [notes on what they cannot express])."""
    f = normalize_classifier_flags(flags)
    b = lambda v: "True" if v else "False"  # noqa: E731
    out = {"image_size": f["image_size"], "classifier_width": f["classifier_width"],
           "classifier_depth": f["classifier_depth"],
           "classifier_attention_resolutions": ",".join(str(r) for r in f["classifier_attention_resolutions"]),
           "classifier_use_scale_shift_norm": b(f["classifier_use_scale_shift_norm"]),
           "classifier_resblock_updown": b(f["classifier_resblock_updown"]), "classifier_pool": f["classifier_pool"]}
    notes = []
    if f["classifier_channel_mult"] != GD_MULT.get(f["image_size"]):
        notes.append(f"channel_mult {f['classifier_channel_mult']} (create_classifier takes it from the image size)")
    if f["classifier_num_head_channels"] != 64:
        notes.append(f"num_head_channels {f['classifier_num_head_channels']} (create_classifier fixes 64)")
    if f["in_channels"] != 3:
        notes.append(f"in_channels {f['in_channels']} (create_classifier fixes 3)")
    if f["num_classes"] != 1000:
        notes.append(f"num_classes {f['num_classes']} (create_classifier fixes 1000)")
    return " ".join(f"--{k} {v}" for k, v in out.items()), notes


def cmd_export(a):
    _check_input(a.input)
    _check_output(a.output, a.input)
    try:
        f = h5py.File(a.input, "r")
    except OSError as e:
        raise CliError(f"{a.input}: cannot open as HDF5 ({str(e).splitlines()[0]})")
    with f:
        classifier = is_classifier_file(f)
        try:
            flags = read_classifier_flags(f) if classifier else read_flags(f)
        except ValueError as e:
            raise CliError(str(e))
        if a.weights == "ema" and "ema" not in f:
            raise CliError(f"{a.input}: has no ema/ group (use --model)")
        group = a.weights or ("ema" if "ema" in f else "model")
        if group not in f:
            raise CliError(f"{a.input}: has no {group}/ group")
        want = classifier_state_dict_shapes(flags) if classifier else state_dict_shapes(flags)
        g = f[group]
        # shapes straight from the file's metadata, so a mismatch is reported before any read
        meta = {k: torch.empty(g[k].shape, device="meta") if isinstance(g[k], h5py.Dataset) and g[k].dtype.kind == "f"
                else g[k].__class__.__name__ for k in g}
        problem = compare_state_dict(meta, want)
        if problem:
            raise CliError(f"{a.input}: {group}/ does not match the model of its attributes: {problem}")
        # guided-diffusion's state_dict order (HDF5 lists names alphabetically)
        sd = OrderedDict((k, torch.from_numpy(np.asarray(g[k][()], dtype=np.float32))) for k, _ in want)
    tmp = f"{a.output}.tmp-{os.getpid()}"

    def save():
        try:
            torch.save(sd, tmp)
            os.replace(tmp, a.output)
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)
    _write(a.output, save)
    n = sum(v.numel() for v in sd.values())
    why = {"ema": "EMA weights (what guided-diffusion releases and samples with)",
           "model": "model weights (the raw training weights, not the EMA)"}[group]
    print(f"{a.output}: {group}/ of {a.input}: {why}; {len(sd)} tensors, {n / 1e6:.2f} M parameters, float32")
    if classifier:
        gd, notes = guided_diffusion_classifier_flags(flags)
        print(f'guided-diffusion CLASSIFIER_FLAGS="{gd}"')
    else:
        gd, notes = guided_diffusion_flags(flags)
        if flags["class_cond"] and flags["null_class"]:
            k = flags["num_classes"]
            print(f"label_emb.weight has {k + 1} rows: classes 0..{k - 1} and row {k}, the null class of "
                  f"classifier-free guidance (trained with class dropout {flags['class_dropout']:g}); a "
                  f"guided-diffusion UNetModel with num_classes={k + 1} loads this state_dict")
        print(f'guided-diffusion MODEL_FLAGS="{gd}"')
    for note in notes:
        print(f"note: guided-diffusion's scripts cannot express {note}")
    return 0


def describe(path):
    _check_input(path)
    try:
        f = h5py.File(path, "r")
    except OSError as e:
        raise CliError(f"{path}: cannot open as HDF5 ({str(e).splitlines()[0]})")
    with f:
        try:
            flags = read_classifier_flags(f) if is_classifier_file(f) else read_flags(f)
        except ValueError as e:
            raise CliError(str(e))
        n = sum(int(np.prod(d.shape)) for d in f["model"].values())
        print(("classifier " if is_classifier_file(f) else "") + _flags_summary(flags))
        print(f"{len(f['model'])} tensors, {n / 1e6:.2f} M parameters; groups: {', '.join(f.keys())}")
    return 0


def build_parser():
    p = _Parser(prog="unet_ckpt.py", description=__doc__.split("\n\n")[0],
                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", parser_class=_Parser)
    pi = sub.add_parser("import", help="guided-diffusion .pt state_dict -> unet checkpoint",
                        description="Converts a plain state_dict (OpenAI's released .pt files) into a unet "
                                    "checkpoint (weights in model/, float32), strictly checked against the model of "
                                    "--preset and the flags; without --preset, flags not given take guided-diffusion's "
                                    "defaults, so the MODEL_FLAGS a model was trained with describe it. Shapes cannot "
                                    "reveal the attention order, head count, noise schedule or dropout: the preset or "
                                    "flags must be the file's.")
    pi.add_argument("input", metavar="FILE.pt")
    pi.add_argument("--preset", choices=list(dict.fromkeys(list(PRESETS) + list(CLASSIFIER_PRESETS))),
                    help="model preset (default: guided-diffusion's defaults); for a classifier a classifier preset "
                         "(imagenet64/128/256/512: OpenAI's released classifiers)")
    pi.add_argument("-o", "--output", required=True, metavar="OUT.h5")
    _add_model_flags(pi)
    _add_classifier_flags(pi)
    pe = sub.add_parser("export", help="unet checkpoint -> guided-diffusion .pt state_dict",
                        description="Writes a checkpoint's weights as a plain float32 state_dict (torch.save of an "
                                    "OrderedDict) that guided-diffusion's scripts load unchanged; EMA weights when the "
                                    "checkpoint has them, as guided-diffusion releases, else the model weights.")
    pe.add_argument("input", metavar="CKPT.h5")
    pe.add_argument("-o", "--output", required=True, metavar="FILE.pt")
    w = pe.add_mutually_exclusive_group()
    w.add_argument("--ema", dest="weights", action="store_const", const="ema", help="the EMA weights (default)")
    w.add_argument("--model", dest="weights", action="store_const", const="model", help="the raw model weights")
    return p


def main(argv):
    """argv without the program name; returns the exit status."""
    try:
        if len(argv) == 1 and argv[0] not in ("import", "export") and not argv[0].startswith("-"):
            return describe(argv[0])
        a = build_parser().parse_args(argv)
        if a.cmd is None:
            raise CliError("usage: unet_ckpt.py CKPT.h5 | import FILE.pt ... | export CKPT.h5 ... (see --help)")
        return cmd_import(a) if a.cmd == "import" else cmd_export(a)
    except CliError as e:
        print(f"unet_ckpt: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
