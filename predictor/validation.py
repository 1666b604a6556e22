"""Is a model fit to serve? Every model must predict plausible, finite, non-decreasing watts.

The extender prices a pod by P(u + d) - P(u) along each node's curve, so a model that predicts
NaN, negative or absurd watts, or power that falls as utilisation rises, would make placements
wrong without anyone noticing. `probe_model` runs one model on a fixed grid of utilisations and
temperatures (`ProbeGrid`) and raises `BundleError` naming the model, the conditions and the
first bad point. The bundle watcher (`predictor.reload`) runs it on every model of a new bundle
before serving it (`validate_predictor`, `load_validated`) and refuses the whole bundle for one
bad model; training (`training.fit`) runs the same check on every candidate model, so it never
writes a bundle the extender would refuse.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from predictor.bundle import FALLBACK_NODE, BundleError, thermal_slopes
from predictor.model import UTIL_FEATURE, Predictor


@dataclass(frozen=True)
class ProbeGrid:
    """Where every model must predict plausible, finite, non-decreasing watts."""

    utils: tuple[float, ...] = tuple(float(u) for u in np.linspace(0.0, 1.0, 11))
    ambient_temps_c: tuple[float, ...] = (18.0, 24.0, 30.0)
    # CPU temperature above ambient at u = 0.5 (thermal slopes move it along u). Relative to
    # ambient because that is how servers behave: a probe at 18 C ambient with a 65 C CPU at
    # half load asks a model about air it never breathed, and polynomials answer nonsense there.
    cpu_above_ambient_c: tuple[float, ...] = (25.0, 32.0, 40.0)
    min_power_w: float = 0.0  # exclusive
    max_power_w: float = 20_000.0  # exclusive
    drop_tolerance_w: float = 2.0  # a step may fall by this much (trees and BMC noise)...
    drop_tolerance_frac: float = 0.01  # ...or by this share of the power, whichever is larger


def probe_model(
    predict_w: Callable[[np.ndarray], np.ndarray],
    features: Sequence[str],
    slopes: Mapping[str, float],
    *,
    where: str,
    probe: ProbeGrid | None = None,
) -> None:
    """Raise ``BundleError`` unless one model is plausible on the probe grid.

    The model runs once on all probe curves (every ambient x CPU temperature combination, u
    swept over ``probe.utils``). ``ambient*`` features take the ambient temperature, other
    ``*_temp_c`` features the CPU temperature moved along the node's thermal slope; any other
    feature is probed at 0. Training runs this same check on every candidate model, so it never
    writes a bundle that the extender would refuse.
    """
    probe = probe or ProbeGrid()
    utils = np.asarray(probe.utils, dtype=np.float64)
    conditions = [(a, a + d) for a in probe.ambient_temps_c for d in probe.cpu_above_ambient_c]
    rows = np.zeros((len(conditions), len(utils), len(features)), dtype=np.float32)
    for n, (ambient_c, cpu_c) in enumerate(conditions):
        for column, name in enumerate(features):
            if name == UTIL_FEATURE:
                rows[n, :, column] = utils
            elif name.startswith("ambient"):
                rows[n, :, column] = ambient_c
            elif name.endswith("_temp_c"):
                rows[n, :, column] = cpu_c + slopes.get(name, 0.0) * (utils - 0.5)
    watts = np.asarray(predict_w(rows.reshape(-1, len(features))), dtype=np.float64)
    for (ambient_c, cpu_c), curve_w in zip(
        conditions, watts.reshape(len(conditions), len(utils)), strict=True
    ):
        at = f"{where} at ambient {ambient_c:g} C, cpu {cpu_c:g} C at u=0.5"
        _check_curve(curve_w, utils, probe, at)


def _check_curve(watts: np.ndarray, utils: np.ndarray, probe: ProbeGrid, where: str) -> None:
    if not np.isfinite(watts).all():
        u = utils[np.flatnonzero(~np.isfinite(watts))[0]]
        raise BundleError(f"{where}: predicts a non-finite value at u={u:g}")
    implausible = (watts <= probe.min_power_w) | (watts >= probe.max_power_w)
    if implausible.any():
        i = int(np.flatnonzero(implausible)[0])
        raise BundleError(
            f"{where}: predicts {watts[i]:.1f} W at u={utils[i]:g}, outside the plausible "
            f"({probe.min_power_w:g}, {probe.max_power_w:g}) W"
        )
    drops = watts[:-1] - watts[1:]
    tolerance = np.maximum(probe.drop_tolerance_w, probe.drop_tolerance_frac * watts[:-1])
    falling = drops > tolerance
    if falling.any():
        i = int(np.flatnonzero(falling)[0])
        raise BundleError(
            f"{where}: power decreases with utilisation, {watts[i]:.1f} W at u={utils[i]:g} "
            f"to {watts[i + 1]:.1f} W at u={utils[i + 1]:g}"
        )


def validate_predictor(predictor: Predictor, probe: ProbeGrid | None = None) -> None:
    """Raise ``BundleError`` unless every model is plausible on the probe grid."""
    served: dict[str, str] = {}  # model key -> a node it serves (for thermal and messages)
    for node in predictor.bundle.nodes:
        served.setdefault(predictor.model_key(node), node)  # type: ignore[arg-type]
    if predictor.bundle.fallback is not None:
        served.setdefault(predictor.bundle.fallback.file, FALLBACK_NODE)

    for key, node in served.items():
        entry = predictor.bundle.fallback if node == FALLBACK_NODE else predictor.entry(node)
        probe_model(
            lambda rows, key=key: predictor.run_model_w(key, rows),
            predictor.features,
            thermal_slopes(entry) if entry is not None else {},
            where=f"{predictor.bundle.directory / key}: node {node!r} model",
            probe=probe,
        )


def load_validated(
    directory: Path, *, intra_op_threads: int = 1, probe: ProbeGrid | None = None
) -> Predictor:
    """Load the bundle at ``directory`` and validate it on the probe grid; ``BundleError``."""
    predictor = Predictor.load(directory, intra_op_threads=intra_op_threads)
    validate_predictor(predictor, probe)
    return predictor
