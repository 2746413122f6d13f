"""Setting a child process up: its device, its Hypothesis profile, every module
imported before anything is drawn, and what is under test, loaded once."""

from __future__ import annotations

import os

from blocktable import device, plugin
from blocktable.plugin import Plugins, SlotMappingFn
from blocktable.properties import fault
from blocktable.properties.lockstep.strategies import V2_KERNELS_VARIABLE
from blocktable.properties.report.frames import where_text
from blocktable.properties.run import profiles
from blocktable.properties.run.calls import counting
from blocktable.properties.run.child import Send
from blocktable.properties.run.messages import Job, Result
from blocktable.properties.slot.truth import harness_kernels

# Ours for the KV kinds no plug-in replaces: "triton" or "torch". Read here, once per
# process; the default is the Triton kernels on a GPU and the torch-native ones under
# the interpreter, where each launch costs milliseconds and a KV world makes three a
# group a step (the KV mutants set "triton").
KV_KERNELS_VARIABLE = "BLOCKTABLE_KV_KERNELS"


def prepare_backend(job: Job, send: Send) -> device.Backend | None:
    """The child's device and profile; None (a config-error result sent) on failure."""
    fault.exit_on_device_faults()
    try:
        backend = device.select(job.device)
    except (RuntimeError, ValueError) as e:
        send(Result("config-error", message=str(e)))
        return None
    os.environ[profiles.PROFILE_VARIABLE] = job.profile
    profiles.register_and_load()
    profiles.collect_less()
    profiles.import_every_module()  # after the backend: kernel modules read TRITON_INTERPRET
    return backend


def plugins_for(slot: str | SlotMappingFn, kv: dict[str, str], backend: device.Backend,
                strict_nan: bool = False, v2: dict[str, str] | None = None,
                classes: dict[str, str] | None = None) -> Plugins:
    """The slot-mapping kernel `slot` names (or `slot` itself, a function), the KV
    kernels `kv` names and the V2 block-table kernels `v2` names, ours for the rest
    (under the interpreter, our torch-native versions unless the environment says
    otherwise: the interpreted Triton ones cost seconds a step)."""
    interpreted = "torch" if backend.interpreted else "triton"
    ours = os.environ.get(KV_KERNELS_VARIABLE, interpreted)
    kernels = plugin.load_kv_kernels({kind: kv.get(kind) or ours for kind in plugin.KV_KINDS})
    v2_kernels = plugin.load_v2_kernels(v2, os.environ.get(V2_KERNELS_VARIABLE, interpreted))
    named = dict(classes or {})
    pool, table, table_v2 = (plugin.resolve_class(named[kind], kind) if named.get(kind) else None
                             for kind in ("pool", "table", "table-v2"))
    fn, name = (plugin.load(slot, harness_kernels()), slot) if isinstance(slot, str) else \
        (slot, getattr(slot, "__name__", "kernel"))
    return Plugins(fn, kernels, name, strict_nan, v2_kernels, pool=pool, classes=named, table=table,
                   table_v2=table_v2)


def config_error(send: Send, error: plugin.PluginError) -> None:
    """A plug-in that cannot be loaded, said on one line, with where in its own file an
    import raised."""
    send(Result("config-error", message=str(error) + (where_text(error.__cause__) if error.__cause__ else "")))


def prepare(job: Job, send: Send) -> tuple[device.Backend, Plugins] | None:
    """The child's device, profile and everything under test, each kernel counting
    its calls (calls.py); None (a config-error result sent) on failure."""
    backend = prepare_backend(job, send)
    if backend is None:
        return None
    try:
        return backend, counting(plugins_for(job.kernel, job.kv, backend, job.strict_nan, job.v2, job.classes))
    except plugin.PluginError as e:
        config_error(send, e)
        return None
