"""The optional PyTorch dependency: imported lazily, with an error naming what is missing."""

import importlib
import json
import subprocess
import sys

import pytest
from conftest import TORCH_MODULES

from gpumem_devtools import _deps


def test_require_names_the_missing_package_and_the_extra(no_torch: None) -> None:
    with pytest.raises(_deps.MissingDependency) as info:
        _deps.require("transformers")
    message = str(info.value)
    assert message.startswith("this needs the Python package 'transformers', "
                              "which is not installed (Python: ")
    assert ("install the [torch] extra of gpumem-devtools (in a gpumem checkout: "
            "pip install './tools[torch]')") in message
    assert info.value.name == "transformers"
    assert isinstance(info.value, ImportError)


def test_a_missing_dependency_of_the_package_is_named_too() -> None:
    err = ModuleNotFoundError("No module named 'numpy'", name="numpy")
    message = str(_deps.missing("torch", err))
    assert "'torch', which fails to import: no module named 'numpy'" in message


def test_require_returns_the_module() -> None:
    assert _deps.require("json") is json


@pytest.mark.parametrize("module", TORCH_MODULES)
def test_torch_modules_fail_to_import_with_the_message(no_torch: None, module: str) -> None:
    with pytest.raises(_deps.MissingDependency, match="needs the Python package 'torch'"):
        importlib.import_module(module)


def test_the_torch_free_modules_do_not_import_torch() -> None:
    # In a fresh interpreter: importing everything a torch-free run uses leaves torch,
    # transformers and torchvision unimported (whether they are installed or not).
    code = ("import sys\n"
            "import gpumem_devtools.capture_trace, gpumem_devtools.convert_trace\n"
            "import gpumem_devtools.measure_peak, gpumem_devtools.tracefile\n"
            "import gpumem_devtools.configs, gpumem_devtools.timeline\n"
            "gpumem_devtools.measure_peak.grid()\n"
            "print(sorted(m for m in ('torch', 'transformers', 'torchvision') "
            "if m in sys.modules))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
