"""Pass@K and Maj@K as DeepSeekMath's Figure 7 reads them: printed and drawn at a run's first and last evaluation.

Shared by the benches that evaluate with ``eval_samples`` K (``bench.supervision_curves`` on the built-in task,
``bench.real_model`` on SmolLM2): each evaluation's metrics carry ``eval/pass@k`` and ``eval/maj@k`` for
k = 1, 2, 4, ... up to K. The paper's reading is Maj@K rising with RL while Pass@K stays flat.
"""

from __future__ import annotations

import statistics
import textwrap
from pathlib import Path


def ks(samples: int) -> list[int]:
    """k = 1, 2, 4, ... up to ``samples`` (the metrics' k)."""
    return [1 << i for i in range(samples.bit_length()) if 1 << i <= samples]


def print_pass_maj(first: dict, last: dict, samples: int) -> None:
    """Pass@k and Maj@k at the first and the last evaluation."""
    print(f"  {'k':>4}  pass@k first -> last (step {first['step']} -> {last['step']})   maj@k first -> last")
    for k in ks(samples):
        p0, p1, m0, m1 = first[f"eval/pass@{k}"], last[f"eval/pass@{k}"], first[f"eval/maj@{k}"], last[f"eval/maj@{k}"]
        print(f"  {k:4d}  {p0:6.3f} -> {p1:6.3f} ({p1 - p0:+.3f}){'':18s}{m0:6.3f} -> {m1:6.3f} ({m1 - m0:+.3f})")


def mean_metrics(runs: list[dict]) -> dict:
    """The evaluations ``runs`` (one per seed, at the same step) as one: each eval/ metric's mean."""
    names = [n for n in runs[0] if n.startswith("eval/")]
    return {"step": runs[0]["step"], **{n: statistics.fmean(r[n] for r in runs) for n in names}}


def plot_pass_maj(
    ends: dict[str, list[tuple[dict, dict]]], samples: int, path: Path, title: str, legend: str = "lower right"
) -> None:
    """Figure 7 for each panel of ``ends`` (label -> [(first, last) evaluation per seed]): Pass@K and Maj@K against
    K (log scale) at the first and the last evaluation, means over the seeds, to ``path`` (PNG; matplotlib,
    ``pip install 'grpo-dashboard[bench]'``); the title wrapped to the figure's width, the legend where ``legend``
    says (matplotlib's locations: where the curves leave room)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(ends), figsize=(max(6.4, 4.6 * len(ends)), 3.6), sharey=True, squeeze=False)
    k = ks(samples)
    for ax, (label, pairs) in zip(axes.flat, ends.items(), strict=True):
        first, last = mean_metrics([p[0] for p in pairs]), mean_metrics([p[1] for p in pairs])
        for at, colour in ((first, "tab:grey"), (last, "tab:blue")):
            for name, style in (("pass", "-o"), ("maj", "--s")):
                ax.plot(k, [at[f"eval/{name}@{i}"] for i in k], style, color=colour, markersize=4,
                        label=f"{name.capitalize()}@K, step {at['step']}")  # fmt: skip
        ax.set_xscale("log", base=2)
        ax.set_xticks(k, [str(i) for i in k])
        ax.set_title(f"{label} ({len(pairs)} seed{'s' if len(pairs) > 1 else ''})", fontsize=10)
        ax.set_xlabel("K (sampled outputs per question)")
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("held-out share")
    axes[0][0].legend(loc=legend, fontsize=8)
    fig.suptitle(textwrap.fill(title, int(fig.get_figwidth() * 11)), fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
