"""Where a command writes: an output directory checked before the work (:func:`out_dir_arg`), and
the loaded run with the directory it writes into locked (:func:`writing_run`)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


def out_dir_arg(value: str | None, flag: str = "--out") -> str | None:
    """An output directory: not empty (an empty path is the current directory), not an existing
    file, and writable (:func:`~pe_interp.util.io.check_writable_dir`), checked before the work.
    None (the command's default) passes."""
    from pe_interp.util.io import check_writable_dir

    if value is None:
        return None
    if not str(value).strip():
        raise ValueError(
            f"{flag} is empty; give a directory (an empty path would write into the current directory)"
        )
    path = Path(value)
    if path.exists() and not path.is_dir():
        raise ValueError(f"{flag} {path}: exists and is not a directory")
    for parent in path.parents:  # a file where a parent directory should be
        if parent.exists():
            if not parent.is_dir():
                raise ValueError(f"{flag} {path}: {parent} is a file, not a directory")
            break
    check_writable_dir(path, flag)
    return value


@contextmanager
def writing_run(
    run_dir: str,
    device: str = "cpu",
    out: str | None = None,
    task: str | None = None,
    preset: str = "quick",
    model_dir_ok: bool = False,
    revision: str | None = None,
) -> Iterator[Any]:
    """The loaded run (:func:`~pe_interp.runs.checkpoint.load_run`: a one-line error for a missing or
    broken run directory; ``RUN@S`` loads the snapshot of step S, whose results go to
    ``loaded.result_dir``, ``RUN/steps/S/``) with the directory the command writes into locked
    (the run's, or ``out``): not while the run trains, nor while another command writes there (a
    one-line error instead). A saved Hugging Face model directory, or a GGUF file, is read as a run
    on ``task`` (:func:`pe_interp.runs.load.open_run`, the one dispatch)."""
    from pe_interp.runs.load import check_destination, open_run
    from pe_interp.util.io import dir_lock

    check_destination(run_dir, out)  # a directory that cannot be written: refused before the work
    loaded = open_run(
        run_dir, task, preset=preset, device=device, revision=revision, pretrained_ok=model_dir_ok
    )
    accuracy = (getattr(loaded, "config", None) or {}).get("accuracy", {}).get("summary")
    if accuracy:  # natural prompts: the model's accuracy on them comes first
        print(f"{loaded.name}: {accuracy}")
    fresh = out is not None and not Path(out).exists()
    try:
        with dir_lock(
            out or loaded.run_dir, "run directory" if out is None else "output directory"
        ):
            loaded.result_dir.mkdir(parents=True, exist_ok=True)  # RUN@S: the step's own steps/S/
            yield loaded
    except BaseException:
        if fresh:  # refused or stopped before writing: no empty --out left behind
            _remove_if_unwritten(Path(out))
        raise


def _remove_if_unwritten(directory: Path) -> None:
    """Remove ``directory`` if it holds nothing but its lock file."""
    from pe_interp.util.locks import LOCK_FILE

    if directory.is_dir() and {p.name for p in directory.iterdir()} <= {LOCK_FILE}:
        (directory / LOCK_FILE).unlink(missing_ok=True)
        directory.rmdir()


__all__ = ["out_dir_arg", "writing_run"]
