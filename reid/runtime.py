"""What every entry point does with a config before it runs a model: the process-wide framework settings
(threads, compile cache) and the evaluation model of a config + MODEL.WEIGHTS. Below both the command-line
layer (reid/engine/launch.py) and deployment (reid/deploy), which import it; it imports neither. Imports of
`compat` stay inside the functions: launch.py selects the backend before anything imports it."""
import os


def configure_runtime(cfg):
    """Process-wide framework settings from cfg, applied by every entry point before it builds a model:
    MindSpore's CPU kernel pool gets MODEL.NUM_THREADS threads (0: REID_NUM_THREADS, else one per core; the
    framework's own default is 30 whatever the machine), compiled graphs are kept in MODEL.COMPILE_CACHE
    ("" = OUTPUT_DIR/compile_cache, "off": nowhere) and run on the helper thread where MODEL.JIT_HELPER_THREAD
    says so. Returns the thread count (None on torch)."""
    import compat
    compat.jit.set_cache_dir(compile_cache_dir(cfg))
    compat.jit.set_helper_thread(cfg.MODEL.JIT_HELPER_THREAD)
    return compat.jit.set_threads(cfg.MODEL.NUM_THREADS)


def compile_cache_dir(cfg):
    """The folder MODEL.COMPILE_CACHE names, or None for "off"."""
    value = str(cfg.MODEL.COMPILE_CACHE).strip()
    if value.lower() == "off":
        return None
    return value or os.path.join(cfg.OUTPUT_DIR, "compile_cache")


def user_cache_dir(cfg=None):
    """Where a model's one-time artifacts (exported files, compiled graphs of the feature extractor) are kept:
    cfg's CACHE_DIR, else $REID_CACHE, else $XDG_CACHE_HOME/acl-reid (an absolute XDG_CACHE_HOME only, as the
    XDG spec says), else ~/.cache/acl-reid. Absolute."""
    folder = str(cfg.CACHE_DIR).strip() if cfg is not None and "CACHE_DIR" in cfg else ""
    folder = folder or os.environ.get("REID_CACHE", "").strip()
    if not folder:
        xdg = os.environ.get("XDG_CACHE_HOME", "").strip()
        base = xdg if os.path.isabs(xdg) else os.path.join(os.path.expanduser("~"), ".cache")
        folder = os.path.join(base, "acl-reid")
    return os.path.abspath(os.path.expanduser(folder))


def num_classes_in_state(state):
    """Per-domain class counts of a saved model (from its classifier shapes), or None."""
    counts = {}
    for key, value in state.items():
        parts = key.split(".")
        if len(parts) == 4 and parts[:2] == ["heads", "classifiers"] and parts[3] == "weight":
            counts[int(parts[2])] = int(value.shape[0])
    return [counts[d] for d in sorted(counts)] if counts else None


def build_eval_model(cfg):
    """The model described by cfg with MODEL.WEIGHTS loaded (class counts taken from the weights), in eval mode.
    The weights are read by reid.engine.checkpointer.model_state_from_file, which knows every file layout a
    model state comes in."""
    import compat
    from reid.errors import UserError
    from reid.engine.checkpointer import model_state_from_file
    from reid.modeling import build_model

    if not cfg.MODEL.WEIGHTS:
        raise UserError("test.py needs trained weights: add MODEL.WEIGHTS path/to/model_final.pth (or "
                        "--reference histogram for the hand-crafted reference alone)")
    state = model_state_from_file(cfg.MODEL.WEIGHTS)
    counts = num_classes_in_state(state)
    cfg = cfg.clone()
    cfg.defrost()
    if counts:
        cfg.MODEL.HEADS.NUM_CLASSES = counts
    # the strict load below fills every tensor, so the ImageNet start a training recipe names is not read
    cfg.MODEL.BACKBONE.PRETRAIN = False
    cfg.freeze()
    compat.set_device(cfg.MODEL.DEVICE)
    model = compat.to_device(build_model(cfg))
    try:
        compat.checkpoint.load_state_dict(model, state)
    except UserError as exc:
        raise UserError("%s does not fit the model of this config (%s); use the config the weights were trained "
                        "with (OUTPUT_DIR/config.yaml; tools/convert.py --from-original reads the original code's)"
                        % (cfg.MODEL.WEIGHTS, exc)) from None
    model.eval()
    return model
