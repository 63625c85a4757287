"""Finding a model's config.json: a catalog name (templates/models), a path, or a directory."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from triarch.paths import TEMPLATES_DIR
from triarch.tuner.arch import ModelArch, TuneError, arch_from_hf_config

if TYPE_CHECKING:
    from triarch.hub import HubModel

MODELS_DIR = TEMPLATES_DIR / "models"
"""The model catalog: one ``<org>--<name>.json`` per Hugging Face repo (architecture fields of its config.json)."""


SIDE_FILES = {"tokenizer_config.json": "_tokenizer_config", "sentence_bert_config.json": "_sentence_bert_config"}
"""Files beside a config.json that bound the context vLLM derives (the tokenizer's model_max_length, a
sentence-transformers max_seq_length), read into the keys a catalog entry uses for them."""


def _catalog_file(name: str) -> Path:
    return MODELS_DIR / (name.replace("/", "--") + ".json")


def catalog_models() -> list[str]:
    """Hugging Face repo names in templates/models/ ("Qwen/Qwen3-8B", ...)."""
    return sorted(p.stem.replace("--", "/", 1) for p in MODELS_DIR.glob("*.json"))


def load_model_config(name_or_path: str | Path) -> dict[str, Any]:
    """A config.json as a dict: a catalog name ("Qwen/Qwen3-8B", or just "Qwen3-8B" when unambiguous), a path to
    a config.json, or a directory holding one. Raises :class:`TuneError` when none matches."""
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        text = str(name_or_path)
        candidates = [_catalog_file(text)] if "/" in text else []
        candidates += [_catalog_file(m) for m in catalog_models() if m.split("/", 1)[-1].lower() == text.lower()]
        found = [c for c in candidates if c.is_file()]
        if not found:
            raise TuneError(
                f"model {text!r}: not a config.json path and not in the catalog; known: {', '.join(catalog_models())}"
            )
        path = found[0]
    try:
        data = json.loads(path.read_text(encoding="utf-8"), object_pairs_hook=_no_duplicates)
    except json.JSONDecodeError as error:
        raise TuneError(f"{path} is not JSON (line {error.lineno}, column {error.colno}: {error.msg})") from None
    except UnicodeDecodeError as error:
        raise TuneError(f"{path} is not UTF-8 text (byte {error.start})") from None
    except OSError as error:
        raise TuneError(f"{path} cannot be read ({error.strerror})") from None
    if not isinstance(data, dict):
        raise TuneError(f"{path}: expected a JSON object")
    for name, key in SIDE_FILES.items():
        side = path.parent / name
        if key not in data and path.name == "config.json" and side.is_file():
            try:
                data[key] = json.loads(side.read_text(encoding="utf-8"))
            except (json.JSONDecodeError, UnicodeDecodeError) as error:
                raise TuneError(f"{side} is not JSON ({error})") from None
    return data


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise TuneError(f"a config.json names {key!r} twice")
        seen[key] = value
    return seen


def load_arch(name_or_path: str | Path) -> ModelArch:
    """:func:`load_model_config` then :func:`arch_from_hf_config`, named after the catalog entry or path."""
    data = load_model_config(name_or_path)
    source = str(data.get("_source", ""))
    name = data.get("_name_or_path") or _repo_from_source(source) or str(name_or_path)
    return arch_from_hf_config(data, name=str(name))


def _repo_from_source(source: str) -> str | None:
    prefix = "https://huggingface.co/"
    if not source.startswith(prefix):
        return None
    parts = source[len(prefix):].split("/")
    return "/".join(parts[:2]) if len(parts) >= 2 else None


def is_local(name_or_path: str | Path) -> bool:
    """A config.json path, a directory holding one, or a catalog entry: what needs no Hub."""
    path = Path(name_or_path).expanduser()
    if path.is_dir() or path.is_file():
        return True
    text = str(name_or_path)
    if "/" in text:
        return _catalog_file(text).is_file()
    return any(m.split("/", 1)[-1].lower() == text.lower() for m in catalog_models())


def find_arch(name_or_path: str | Path, *, revision: str | None = None, token: str | None = None,
              config_key: str = "modelConfig: path/to/config.json") -> tuple[ModelArch, HubModel | None]:
    """A model's architecture from a path or the catalog, else (or at a pinned `revision`) from the Hugging Face
    Hub through triarch.hub, with what was read there. Raises :class:`TuneError` for a model whose architecture the
    tuner does not know, :class:`triarch.hub.HubError` for what the Hub refused or could not give."""
    if revision is None and is_local(name_or_path):
        return load_arch(name_or_path), None
    from triarch import hub

    text = str(name_or_path)
    if "/" not in text:  # a short name the catalog does not hold: no repository to ask the Hub for
        load_model_config(text)
    hub.check_repo(text)
    read = hub.resolve(text, revision, token, config_key=config_key)
    return hub_arch(read), read


def hub_config(read: HubModel) -> dict[str, Any]:
    """The config.json of a model read from the Hub, with the files beside it and the checkpoint's dtype."""
    return read.completed(load_model_config(read.directory / "config.json"))


def hub_arch(read: HubModel) -> ModelArch:
    """The architecture of a model read from the Hub; :class:`TuneError` names the commit where the tuner refuses
    it (an architecture it does not know)."""
    try:
        return arch_from_hf_config(hub_config(read), name=read.repo)
    except TuneError as error:
        raise TuneError(f"{read.repo} at {read.commit}: {error}") from None
