"""Rules of the manifest's expert geometry (``ExecutionManifest.expert_geometry``): the
declaration is consistent, and every launch of an expert op agrees with it.

An expert op's scalars name the geometry (E experts, K per token, hidden D, expert width
F, NORM, block rows BT) and its stacked weight views have its shapes ([E, 2F, D] for
``moe_gate_up``'s ``w_gate_up``, [E, D, F] for ``moe_down``'s ``w_down``), so a kernel
can never run a geometry other than the declared one. Parameters are found by name in
the manifest's kernel table.
"""

from __future__ import annotations

from collections.abc import Iterator

from helios_contract._gen.helios.v1 import manifest_pb2 as mpb
from helios_contract.errors import ExpertGeometryError
from helios_contract.findings import Finding

F = Finding.of
Findings = Iterator[Finding]

EXPERT_OPS = ("moe_route", "moe_align", "moe_gate_up", "moe_down", "moe_sum")
PATH = "manifest.expert_geometry"


def _declared(g: mpb.ExpertGeometry) -> dict[str, int]:
    """Scalar parameter name -> the value the geometry fixes."""
    return {"E": g.experts, "K": g.experts_per_token, "D": g.hidden, "F": g.expert_width,
            "NORM": int(g.normalize_top_k), "BT": g.block_rows}


def _stacked(g: mpb.ExpertGeometry) -> dict[str, list[int]]:
    """Stacked weight parameter name -> its view shape."""
    E, D, F_ = g.experts, g.hidden, g.expert_width
    return {"w_gate_up": [E, 2 * F_, D], "w_down": [E, D, F_]}


def expert_findings(manifest: mpb.ExecutionManifest, kernels: dict[str, mpb.Kernel]
                    ) -> Findings:
    """The declaration's own consistency, then every expert launch against it."""
    declared = manifest.HasField("expert_geometry")
    g = manifest.expert_geometry
    if declared:
        for field in ("experts", "hidden", "expert_width", "block_rows"):
            if getattr(g, field) == 0:
                yield F("experts.geometry", ExpertGeometryError, f"{PATH}.{field}", 0,
                        "must be positive")
        if not 1 <= g.experts_per_token <= g.experts:
            yield F("experts.geometry", ExpertGeometryError, f"{PATH}.experts_per_token",
                    g.experts_per_token, f"top-k must lie in 1..{g.experts} (the experts)")
    scalars, shapes = _declared(g), _stacked(g)
    for kind, programs in (("graphs", manifest.graphs),
                           ("tuning.producers", manifest.tuning.producers)):
        for i, program in enumerate(programs):
            for j, launch in enumerate(program.launches):
                kernel = kernels.get(launch.kernel)
                if kernel is None or kernel.reference_op not in EXPERT_OPS:
                    continue  # an unknown kernel is the launch rules' finding
                path = f"manifest.{kind}[{i}].launches[{j}]"
                if not declared:
                    yield F("experts.undeclared", ExpertGeometryError, path,
                            kernel.reference_op, "an expert op needs the manifest's "
                            "expert_geometry")
                    continue
                for a, (arg, param) in enumerate(zip(launch.args, kernel.params,
                                                     strict=False)):
                    which = arg.WhichOneof("value")
                    if param.name in scalars and which == "int_value" \
                            and arg.int_value != scalars[param.name]:
                        yield F("experts.launch", ExpertGeometryError, f"{path}.args[{a}]",
                                arg.int_value, f"{kernel.reference_op}'s {param.name} must be "
                                f"the declared {scalars[param.name]}")
                    if param.name in shapes and which == "buffer" \
                            and list(arg.buffer.shape) != shapes[param.name]:
                        yield F("experts.weights", ExpertGeometryError,
                                f"{path}.args[{a}].buffer.shape", list(arg.buffer.shape),
                                f"{param.name} must be the declared stack "
                                f"{shapes[param.name]}")
