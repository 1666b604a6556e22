"""CloudPreference (score): steer pods without delay constraints to the cloud nodes.

The edge seed binds every pod without a `delay_<from>` label to a node labelled
`kubernetes.io/role=cloud` (contract 4), which keeps the edge sites' few nodes free for the pods
that must run near something. Here that is a preference, not a rule: for a pod without
`delay_*` labels, cloud nodes score 10 points and the others 0; for a pod with constraints
every candidate scores 0 (the Delay filter has already kept only the nodes near enough, and
this plugin does not push them anywhere). How strongly it steers is its weight beside the power
score: at weight 0.3 against PowerIncrease 0.6, a cloud node still loses to an edge node whose
power increase is less than half as large (10 * 0.3 / 0.6 = 5 power points: one halving).

`nodeSelector` (`key=value`, default `kubernetes.io/role=cloud`) says which nodes are the
cloud's. `/explain` adds `cloud_node`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from extender.plugins.base import Plugin
from extender.plugins.delay import delay_constraints
from extender.state import NodeAttribute
from livedata.labels import CLOUD_ROLE, ROLE_LABEL

if TYPE_CHECKING:
    from extender.cycle import Cycle

CLOUD_POINTS = 10.0


@dataclass(frozen=True)
class CloudPreferenceArgs:
    # The label (key=value) of the cloud nodes.
    node_selector: str = f"{ROLE_LABEL}={CLOUD_ROLE}"

    def __post_init__(self) -> None:
        key, equals, value = self.node_selector.partition("=")
        if not equals or not key.strip() or not value.strip():
            raise ValueError(
                f"nodeSelector must be key=value (e.g. {ROLE_LABEL}={CLOUD_ROLE}), "
                f"got {self.node_selector!r}"
            )

    @property
    def label(self) -> tuple[str, str]:
        key, _, value = self.node_selector.partition("=")
        return key.strip(), value.strip()


class CloudPreference(Plugin):
    name = "CloudPreference"
    Args = CloudPreferenceArgs

    def __init__(self, args: Any = None) -> None:
        super().__init__(args)
        key, value = self.args.label
        # One attribute per configured selector, computed once per node change.
        self.cloud_node = NodeAttribute(
            f"cloud_node[{key}={value}]",
            lambda node: node.labels.get(key) == value,
            np.bool_,
            False,
        )
        self.node_attributes = (self.cloud_node,)

    def score(self, cycle: Cycle) -> np.ndarray:
        if delay_constraints(cycle.pod):
            return np.zeros(len(cycle))
        return np.where(cycle.node_values(self.cloud_node), CLOUD_POINTS, 0.0)

    def explain(self, cycle: Cycle) -> Mapping[str, Sequence[object]]:
        return {"cloud_node": cycle.node_values(self.cloud_node).tolist()}
