"""The served extender against another revision of itself, side by side in one run.

    python -m bench.extender_latency --baseline REV [--requests 300]

Checks out REV (any git revision: a commit, a tag, `main~3`) into a temporary worktree, serves
both versions as subprocesses (`python -m extender`, each from its own code) on the same
bundle and cluster snapshot, and sends them the same requests in interleaved rounds: a block
for today's code, a block for the baseline, and again, so that whatever else the machine is
doing falls on both alike. Requests go out in one write each, as kube-scheduler's transport
sends them; the figure compared is the server-side time (`Server-Timing: app`), body in hand
to answer built. Prints p50/p99 per scenario and today's p50 over the baseline's: above 1 is
a slowdown.
"""

from __future__ import annotations

import contextlib
import logging
import subprocess
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import numpy as np
from tqdm import tqdm

from bench.support.http import OneWriteClient, measure
from bench.support.server import REPO_ROOT, run_extender

log = logging.getLogger("bench.extender_baseline")

ROUNDS = 6  # interleaved blocks per scenario and version


@contextlib.contextmanager
def checkout(revision: str) -> Iterator[Path]:
    """A temporary git worktree of `revision` (removed afterwards); ValueError if unknown."""
    resolved = subprocess.run(
        ["git", "rev-parse", "--verify", f"{revision}^{{commit}}"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
    )
    if resolved.returncode != 0:
        raise ValueError(f"--baseline {revision}: not a revision of this repository")
    with tempfile.TemporaryDirectory(prefix="extender-baseline-") as tmp:
        tree = Path(tmp) / "tree"
        subprocess.run(
            ["git", "worktree", "add", "--detach", str(tree), resolved.stdout.strip()],
            cwd=REPO_ROOT,
            check=True,
            capture_output=True,
        )
        try:
            yield tree
        finally:
            subprocess.run(
                ["git", "worktree", "remove", "--force", str(tree)],
                cwd=REPO_ROOT,
                capture_output=True,
            )


def compare(
    revision: str,
    server_args: Sequence[str],
    bodies: Mapping[str, bytes],
    requests: int,
    *,
    quiet: bool,
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Server-side ms per scenario: (today, baseline), measured in interleaved rounds."""
    block = max(10, requests // ROUNDS)
    samples: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name in bodies}
    with (
        checkout(revision) as tree,
        run_extender(server_args) as today,
        run_extender(server_args, source=tree) as baseline,
    ):
        log.info("serving today's code at %s and %s's at %s", today.url, revision, baseline.url)
        clients = (OneWriteClient(today.url), OneWriteClient(baseline.url))
        try:
            steps = [(name, r) for name in bodies for r in range(ROUNDS)]
            for name, _ in tqdm(steps, desc="baseline rounds", disable=quiet):
                verb = "/" + name.split()[0]
                for side, client in enumerate(clients):
                    result = measure(
                        client,
                        name,
                        lambda client=client, verb=verb, name=name: client.post(verb, bodies[name]),
                        len(bodies[name]),
                        block,
                    )
                    samples[name][side].extend(result.server_ms.tolist())
        finally:
            for client in clients:
                client.close()
    return {name: (np.array(a), np.array(b)) for name, (a, b) in samples.items()}


def print_comparison(revision: str, figures: Mapping[str, tuple[np.ndarray, np.ndarray]]) -> None:
    print(f"\nserver-side ms, today's code against {revision} (same machine, interleaved rounds)")
    print(f"{'scenario':<31} {'today p50/p99':>15} {'baseline p50/p99':>17} {'p50 ratio':>10}")
    for name, (today, baseline) in figures.items():
        t50, t99 = np.percentile(today, [50, 99])
        b50, b99 = np.percentile(baseline, [50, 99])
        print(f"{name:<31} {t50:7.3f} {t99:7.3f} {b50:8.3f} {b99:8.3f} {t50 / b50:10.2f}")
    print("p50 ratio = today / baseline: above 1 means today's code is slower")
