"""Where the gpumem checkout is: the commands write into its testdata/ by default."""

from pathlib import Path


def is_repo(path: Path) -> bool:
    """Whether `path` is the root of a gpumem checkout."""
    return (path / "tools" / "pyproject.toml").is_file() and (path / "testdata").is_dir()


def find_repo(start: Path | None = None) -> Path | None:
    """The gpumem checkout holding `start` (default: the current directory), else the one
    holding this package (an in-tree or target/ install), else None."""
    here = (start or Path.cwd()).resolve()
    package = Path(__file__).resolve().parent
    for base in (here, package):
        for path in (base, *base.parents):
            if is_repo(path):
                return path
    return None


def repo_root(explicit: Path | None = None) -> Path:
    """`explicit` if given (checked), else `find_repo()`; ValueError if there is none."""
    if explicit is not None:
        if not is_repo(explicit):
            raise ValueError(f"{explicit} is not a gpumem checkout "
                             "(no testdata/ and tools/pyproject.toml in it)")
        return explicit.resolve()
    found = find_repo()
    if found is None:
        raise ValueError("cannot find the gpumem checkout (a folder with testdata/ and "
                         "tools/pyproject.toml) from the current directory: run inside it "
                         "or pass --repo")
    return found
