"""open_clip's loss module (ClipLoss, SigLipLoss), loaded on its own when open_clip_torch is
installed: loss.py needs only torch, and open_clip's __init__ imports torchvision, which fails
when torchvision was built for another torch (CI installs open_clip_torch with --no-deps)."""
import importlib.util
import pathlib
from types import ModuleType
from typing import Optional


def open_clip_loss_module() -> Optional[ModuleType]:
    """open_clip's loss.py as a module, or None when open_clip_torch is not installed."""
    spec = importlib.util.find_spec("open_clip")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = pathlib.Path(list(spec.submodule_search_locations)[0]) / "loss.py"
    if not path.exists():
        return None
    mod_spec = importlib.util.spec_from_file_location("_open_clip_loss_original", path)
    mod = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(mod)
    return mod
