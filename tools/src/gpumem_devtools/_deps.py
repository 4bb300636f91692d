"""Optional dependencies (torch, transformers, torchvision): imported only where needed."""

import importlib
import sys
from types import ModuleType

INSTALL_HINT = "in a gpumem checkout: pip install './tools[torch]'"


class MissingDependency(ImportError):
    """An optional package that the requested work needs is not installed."""


def missing(package: str, err: ImportError) -> MissingDependency:
    """The error to raise when importing optional `package` failed with `err`."""
    absent = getattr(err, "name", None) or package
    why = ("which is not installed" if absent.split(".")[0] == package
           else f"which fails to import: no module named '{absent}'")
    return MissingDependency(
        f"this needs the Python package '{package}', {why} (Python: {sys.executable}); "
        f"install the [torch] extra of gpumem-devtools ({INSTALL_HINT})", name=package)


def require(module: str) -> ModuleType:
    """`importlib.import_module(module)`, or a MissingDependency naming the package."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as err:
        raise missing(module.split(".")[0], err) from err
