"""Models read from the Hugging Face Hub: a repository's config.json, and the files beside it the tuner reads, at
one revision, through the huggingface_hub client, into a cache outside the work tree, each read recorded with the
commit it read.

The Hub is `$HF_ENDPOINT` (a mirror, or a test's server on loopback), else huggingface.co. The token is the one
given (the stack's `triarch:hfToken` under the Pulumi CLI), else `$HF_TOKEN`; no other (a login saved by `hf auth
login` is not read), and it is never written anywhere Triarch writes. Where the Hub cannot be reached, a revision
read before is served from the cache; a model never read says how to bring it, in one line.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from triarch.errors import TriarchError

DEFAULT_ENDPOINT = "https://huggingface.co"
DEFAULT_REVISION = "main"
CONFIG_FILE = "config.json"
SIDE_FILES = ("tokenizer_config.json", "sentence_bert_config.json")
"""Files beside config.json that bound the context vLLM derives (triarch.tuner.model_files reads them too)."""
TIMEOUT_SECONDS = 10.0
"""How long one request waits for the Hub: huggingface_hub's own default for its metadata requests
(constants.DEFAULT_ETAG_TIMEOUT = 10 in huggingface_hub 2.4.0)."""
COMMIT = re.compile(r"^[0-9a-f]{40}$")
"""A commit id as the Hub names one (40 hex digits); any other revision is a branch or tag that can move."""
REPO = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
"""`org/name`, as the stack schema's `model` key allows."""
FETCH = "triarch model fetch"
"""The command that reads a model from the Hub into the cache (triarch.cli.model)."""
FLOAT_DTYPES = {"BF16": "bfloat16", "F16": "float16", "F32": "float32"}
"""The safetensors format's dtype names (as its headers and the Hub's model info, `safetensors.parameters`, write
them) that name a checkpoint's dtype as config.json does (`torch_dtype`); the packed integer dtypes of quantized
checkpoints (I32, U8) and FP8's scales say nothing of it."""


class HubError(TriarchError):
    """What the Hub refused or could not give, in one line."""


class HubUnreachable(HubError):
    """The Hub could not be reached (no network, a wrong HF_ENDPOINT, HF_HUB_OFFLINE set)."""


@dataclass(frozen=True)
class HubModel:
    """One model as read from the Hub (or the cache of an earlier read)."""

    repo: str
    revision: str
    """What was asked for: a branch, a tag or a commit (default main)."""
    commit: str
    """The commit that was read."""
    directory: Path
    """The cached snapshot of that commit: config.json and the side files it has."""
    files: tuple[str, ...]
    parameters: Mapping[str, int] = field(default_factory=dict)
    """Parameters per safetensors dtype, as the Hub counts them from the checkpoint's headers; empty where the Hub
    gave none."""
    notes: tuple[str, ...] = ()
    """What a plan should say about the revision: moved since the last read, read from the cache while offline."""
    gated: bool = False
    """The Hub gates its files behind an accepted license (its model info's `gated`): the pods need a token too."""

    @property
    def pinned(self) -> bool:
        return bool(COMMIT.match(self.revision))

    @property
    def parameter_count(self) -> int | None:
        return sum(self.parameters.values()) if self.parameters else None

    @property
    def checkpoint_dtype(self) -> str | None:
        """The float dtype that holds most of the checkpoint's parameters, as config.json names dtypes."""
        floats = {FLOAT_DTYPES[k]: n for k, n in self.parameters.items() if k in FLOAT_DTYPES}
        return max(floats, key=lambda k: floats[k]) if floats else None

    def completed(self, data: dict[str, Any]) -> dict[str, Any]:
        """The config.json read from :attr:`directory` (triarch.tuner.model_files) named after the repository, with
        the checkpoint's dtype where it names none."""
        data.setdefault("_name_or_path", self.repo)
        dtype = self.checkpoint_dtype
        if dtype and not (data.get("torch_dtype") or data.get("dtype")):
            data["torch_dtype"] = dtype
        return data

    def describe(self) -> str:
        """`org/name at <commit> (<revision>)`: how a plan names what it read."""
        asked = "" if self.pinned else f" ({self.revision})"
        return f"{self.repo} at {self.commit}{asked}"


def endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def cache_root() -> Path:
    """$TRIARCH_HUB_CACHE, else <XDG cache>/triarch/hub: outside the work tree, kept between clones (the files in
    huggingface_hub's own cache layout, Triarch's records of what it read in records/)."""
    from triarch.local.engines import user_cache

    return user_cache("TRIARCH_HUB_CACHE", "hub")


def env_token() -> str | None:
    return os.environ.get("HF_TOKEN") or None


def _offline_forced() -> bool:
    return (os.environ.get("HF_HUB_OFFLINE") or "").strip().lower() in ("1", "true", "yes", "on")


def check_repo(repo: str) -> None:
    if not REPO.match(repo):
        raise HubError(f"model {repo!r} is not a Hugging Face repository id; allowed: org/name (e.g. "
                       "mistralai/Mistral-7B-Instruct-v0.3)")


# --- what was read: records/<org>--<name>.json ------------------------------------------------------------

def _record_path(repo: str) -> Path:
    return cache_root() / "records" / (repo.replace("/", "--") + ".json")


def _read_record(repo: str) -> dict[str, Any]:
    path = _record_path(repo)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {"repo": repo, "refs": {}, "commits": {}}
    if not isinstance(data, dict):
        return {"repo": repo, "refs": {}, "commits": {}}
    data.setdefault("refs", {})
    data.setdefault("commits", {})
    return data


def _write_record(repo: str, record: Mapping[str, Any]) -> None:
    path = _record_path(repo)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(f".{os.getpid()}.partial")
    partial.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    partial.replace(path)


def _snapshot(repo: str, commit: str) -> Path:
    return cache_root() / ("models--" + repo.replace("/", "--")) / "snapshots" / commit


def cached(repo: str, revision: str | None = None) -> HubModel | None:
    """The model as last read at `revision` (a commit, or the commit a branch or tag named when last read)."""
    revision = revision or DEFAULT_REVISION
    record = _read_record(repo)
    commit = revision if COMMIT.match(revision) else record["refs"].get(revision)
    entry = record["commits"].get(commit) if commit else None
    if not commit or not isinstance(entry, dict):
        return None
    directory = _snapshot(repo, commit)
    if not (directory / CONFIG_FILE).is_file():
        return None
    return HubModel(repo, revision, commit, directory, tuple(entry.get("files") or ()),
                    {str(k): int(v) for k, v in (entry.get("parameters") or {}).items()},
                    gated=bool(entry.get("gated")))


# --- reading from the Hub ---------------------------------------------------------------------------------

def _gated(repo: str, token: str | None) -> HubError:
    if token is None:
        return HubError(f"model {repo!r} is gated on the Hub: set HF_TOKEN to the token of an account that accepted "
                        f"its license on {DEFAULT_ENDPOINT}/{repo} (the stack's triarch:hfToken is used under the "
                        "Pulumi CLI)")
    return HubError(f"model {repo!r} is gated on the Hub and the token given (HF_TOKEN or triarch:hfToken) is "
                    f"refused: its account must accept the license on {DEFAULT_ENDPOINT}/{repo}")


def _failure(error: Exception, repo: str, revision: str, token: str | None) -> HubError:
    """One line for what the client raised (never its own text, which names URLs and request ids)."""
    import httpx2
    from huggingface_hub import errors

    if isinstance(error, httpx2.TransportError | errors.OfflineModeIsEnabled | errors.LocalEntryNotFoundError):
        return HubUnreachable(f"the Hub ({endpoint()}) cannot be reached ({type(error).__name__})")
    if isinstance(error, errors.GatedRepoError):
        return _gated(repo, token)
    if isinstance(error, errors.RevisionNotFoundError):
        return HubError(f"model {repo!r} has no revision {revision!r} on the Hub; allowed: a branch, a tag or a "
                        "commit of the repository")
    if isinstance(error, errors.RepositoryNotFoundError):
        hint = "" if token else " (a private repository needs HF_TOKEN)"
        return HubError(f"model {repo!r} is not on the Hub ({endpoint()}){hint}")
    if isinstance(error, errors.EntryNotFoundError):
        return HubError(f"model {repo!r} at {revision} has no {CONFIG_FILE} on the Hub: it is not a transformers "
                        "model vLLM can read")
    if isinstance(error, errors.HfHubHTTPError):
        status = error.response.status_code if error.response is not None else 0
        if status == 429 or status >= 500:  # busy or down: as good as unreachable, a cached read still serves
            return HubUnreachable(f"the Hub ({endpoint()}) answered {status}")
        return HubError(f"the Hub ({endpoint()}) answered {status or 'an error'} for model {repo!r}")
    raise error


def fetch(repo: str, revision: str | None = None, token: str | None = None) -> HubModel:
    """Read `repo` at `revision` from the Hub into the cache and record the commit read (raises HubError)."""
    check_repo(repo)
    revision = revision or DEFAULT_REVISION
    if _offline_forced():
        raise HubUnreachable(f"the Hub ({endpoint()}) is not asked: HF_HUB_OFFLINE is set")
    # The client's telemetry would also fetch a registry of AI agents from the Hub, once a day, to name one in its
    # user agent (huggingface_hub 2.4.0 utils/_detect_agent.py): Triarch asks the Hub for the model and nothing else.
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    from huggingface_hub import HfApi, hf_hub_download

    # False, not None: without a token the client would read a saved login, which no stack names.
    auth: str | bool = token or False
    api = HfApi(endpoint=endpoint(), token=auth)
    try:
        info = api.model_info(repo, revision=revision, timeout=TIMEOUT_SECONDS)
        commit = str(info.sha or "")
        if not COMMIT.match(commit):
            raise HubError(f"the Hub ({endpoint()}) named no commit for model {repo!r} at {revision!r}")
        present = {s.rfilename for s in info.siblings or ()}
        if CONFIG_FILE not in present:
            raise HubError(f"model {repo!r} at {commit} has no {CONFIG_FILE} on the Hub: it is not a transformers "
                           "model vLLM can read")
        files = (CONFIG_FILE, *(name for name in SIDE_FILES if name in present))
        paths = [Path(str(hf_hub_download(repo, name, revision=commit, cache_dir=cache_root(), token=auth,
                                          endpoint=endpoint(), etag_timeout=TIMEOUT_SECONDS)))
                 for name in files]
    except HubError:
        raise
    except Exception as error:  # the client's own exceptions, each said in one line
        raise _failure(error, repo, revision, token) from None
    parameters = {str(k): int(v) for k, v in ((info.safetensors.parameters if info.safetensors else None)
                                              or {}).items()}
    if not parameters:  # a Hub (a mirror) that does not count them: read the safetensors headers
        parameters = _header_count(api, repo, commit, present, auth)
    record = _read_record(repo)
    before = record["refs"].get(revision)
    notes: tuple[str, ...] = ()
    if before and before != commit and not COMMIT.match(revision):
        notes = (f"revision {revision!r} of {repo} has moved: {commit} now, {before} when last read",)
    if not COMMIT.match(revision):
        record["refs"][revision] = commit
    gated = bool(info.gated)  # "auto" or "manual" where gated, False where not
    record["commits"][commit] = {"files": list(files), "parameters": parameters, "gated": gated}
    _write_record(repo, record)
    return HubModel(repo, revision, commit, paths[0].parent, files, parameters, notes, gated)


SAFETENSORS_FILE = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
"""A checkpoint in one safetensors file, or shards listed by an index's weight_map (huggingface_hub's
constants.SAFETENSORS_SINGLE_FILE and SAFETENSORS_INDEX_FILE)."""


def _header_count(api: Any, repo: str, commit: str, present: set[str], auth: str | bool) -> dict[str, int]:
    """Parameters per dtype from the safetensors headers (the client reads each file's first bytes by a range
    request, `HfApi.parse_safetensors_file_metadata`); empty where the checkpoint is not safetensors or a header
    cannot be read: the count is told, never needed."""
    import httpx2
    from huggingface_hub import errors, hf_hub_download

    try:
        if SAFETENSORS_INDEX in present:
            index = Path(str(hf_hub_download(repo, SAFETENSORS_INDEX, revision=commit, cache_dir=cache_root(),
                                             token=auth, endpoint=endpoint(), etag_timeout=TIMEOUT_SECONDS)))
            shards = sorted(set(json.loads(index.read_text(encoding="utf-8")).get("weight_map", {}).values()))
        elif SAFETENSORS_FILE in present:
            shards = [SAFETENSORS_FILE]
        else:
            return {}
        total: dict[str, int] = {}
        for shard in shards:
            header = api.parse_safetensors_file_metadata(repo, shard, revision=commit, timeout=TIMEOUT_SECONDS)
            for dtype, count in header.parameter_count.items():
                total[str(dtype)] = total.get(str(dtype), 0) + int(count)
        return total
    except (httpx2.TransportError, errors.HfHubHTTPError, errors.SafetensorsParsingError,
            errors.LocalEntryNotFoundError, ValueError, AttributeError):
        return {}


def offline_line(repo: str, revision: str, why: str, config_key: str) -> str:
    """The one line for a model to be read from the Hub (outside the catalog, or pinned to a revision) that was
    never read while the Hub is unreachable: both ways in."""
    at = "" if revision == DEFAULT_REVISION else f" --revision {revision}"
    return (f"model {repo!r} was never read from the Hub at {revision}, and {why}: "
            f"read it where the Hub is reachable with `{FETCH} {repo}{at}` (cached in {cache_root()}), or give "
            f"its config.json with {config_key}")


_READ: dict[tuple[str, str, str, str], HubModel] = {}
"""What this process has read, so one plan asks the Hub once per model however many times it sizes it."""


def forget() -> None:
    """Forget this process's reads (tests that move a revision on their Hub)."""
    _READ.clear()


def resolve(repo: str, revision: str | None = None, token: str | None = None, *,
            config_key: str = "modelConfig: path/to/config.json") -> HubModel:
    """`repo` at `revision` from the Hub, else (unreachable) from the cache of an earlier read, saying so; a model
    in neither raises HubUnreachable with :func:`offline_line`."""
    revision = revision or DEFAULT_REVISION
    key = (repo, revision, endpoint(), str(cache_root()))
    if key in _READ:
        return _READ[key]
    try:
        model = fetch(repo, revision, token or env_token())
    except HubUnreachable as error:
        hit = cached(repo, revision)
        if hit is None:
            raise HubUnreachable(offline_line(repo, revision, str(error), config_key)) from None
        if not hit.pinned:
            hit = replace(hit, notes=(f"{error}: {repo} is sized at {hit.commit}, what {revision} named when last "
                                      f"read (`{FETCH} {repo}` reads it again)",))
        model = hit
    _READ[key] = model
    return model
