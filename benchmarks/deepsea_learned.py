r"""DeepSea runs side by side: the fraction of seeds that have learned the task by each episode.

    python -m benchmarks.deepsea_learned --size=40 \
        --runs="csd_sa, one env=docs/results/deepsea_env1_40" \
        --runs="BDQN+P, 4 envs=docs/results/deepsea_bsuite40/bdqn" \
        --out_dir=docs/results/deepsea_learned40

Each ``--runs`` is ``LABEL=FOLDER[,FOLDER...]``: the runs of one agent and setting (refused if
the folders hold several agents' runs), read from every ``summary.json`` under the folders
(``rl.deepsea`` or ``benchmarks.exploration`` output) whose size is ``--size``; a seed found in
several folders takes the last folder's run. A run has learned at bsuite's learning time
(``rl.records.bsuite_learned_episode``); an unlearned run counts where that is settled
(``learned_episode``); one stopped earlier, e.g. 100 episodes after an early first success, is
listed as undetermined and left out.

Writes OUT_DIR/learned.json (per label: seeds, learned episodes, the count learned, the median
learned episode with unlearned runs counted as never, and Fisher's exact test of each label's
count against the first label's) and learned.png (the fraction of seeds learned against
episodes, one line per label), and prints one line per label.
"""

from __future__ import annotations

import json
import pathlib

import matplotlib
import numpy as np
import scipy.stats
from absl import flags

from cmdline import cli
from cmdline import flag_checks
from rl import records

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the file-only backend)

FLAGS = flags.FLAGS


def define_flags() -> None:
  """The report's flags; under ``__main__`` only."""
  flags.DEFINE_multi_string("runs", None, "LABEL=FOLDER[,FOLDER...], one per line.", required=True)
  flags.DEFINE_integer("size", 40, "The DeepSea size N whose runs are read.")
  flags.DEFINE_string("out_dir", "out/deepsea_learned", "Where learned.json and .png go.")
  flag_checks.writable_dir("out_dir")
  flag_checks.positive("size")


def parse_runs(specs: list[str]) -> list[tuple[str, list[pathlib.Path]]]:
  """``LABEL=FOLDER[,FOLDER...]`` specs as (label, folders); raises ``cli.ConfigError`` on a
  spec without a label or folder, a repeated label, or a folder that does not exist."""
  parsed = []
  for spec in specs:
    label, eq, folders = spec.partition("=")
    paths = [pathlib.Path(f) for f in folders.split(",") if f]
    if not eq or not label or not paths:
      raise cli.ConfigError(f"--runs={spec!r}: expected LABEL=FOLDER[,FOLDER...]")
    if label in (seen := [p[0] for p in parsed]):
      raise cli.ConfigError(f"--runs: label {label!r} given twice (labels: {seen})")
    for p in paths:
      if not p.is_dir():
        raise cli.ConfigError(f"--runs={spec!r}: {p} is not a folder")
    parsed.append((label, paths))
  return parsed


def learned_episode(summary: dict) -> tuple[bool, int | None]:
  """(determined, learned episode or None) of one run's ``summary.json``. Unlearned is
  determined for a run that used its whole episode budget M with the grade recorded or without
  a success, and for one whose first success f came too late to be learned within M: at every
  e <= M the missed fraction is >= (f - 1) / M, so f - 1 >= 0.9 M rules learning out."""
  learned = summary.get("bsuite_learned_episode")
  if learned is not None:
    return True, int(learned)
  budget = int(summary["config"]["max_episodes"])
  first = summary.get("first_success_episode")
  if summary["episodes"] >= budget and ("bsuite_learned_episode" in summary or first is None):
    return True, None
  return first is not None and first - 1 >= records.BSUITE_BAD_FRACTION * budget, None


def read_runs(folders: list[pathlib.Path], size: int) -> dict[int, dict]:
  """Seed -> ``{"determined", "learned": episode or None, "max_episodes", "agent"}`` of the
  DeepSea-``size`` runs under ``folders`` (the last folder wins a seed found twice)."""
  runs = {}
  for folder in folders:
    for path in sorted(folder.rglob("summary.json")):
      s = json.loads(path.read_text())
      if s.get("env", "deepsea") != "deepsea" or s.get("size") != size:
        continue
      determined, learned = learned_episode(s)
      runs[int(s["seed"])] = dict(
          determined=determined,
          learned=learned,
          max_episodes=int(s["config"]["max_episodes"]),
          agent=s["agent"],
      )
  return runs


def _never_as_inf(learned: list[int | None]) -> np.ndarray:
  """Learned episodes as float64, an unlearned run (None) at +inf."""
  return np.array([np.inf if e is None else e for e in learned], np.float64)


def learned_fraction(learned: list[int | None], episodes: np.ndarray) -> np.ndarray:
  """(len(episodes),) fraction of the runs whose learned episode is <= each of ``episodes``
  (None: never learned)."""
  at = _never_as_inf(learned)
  return (at[None, :] <= np.asarray(episodes, np.float64)[:, None]).mean(axis=1)


def median_learned(learned: list[int | None]) -> float | None:
  """The median learned episode over all runs, an unlearned run counting as never (None when
  fewer than half learned)."""
  m = float(np.median(_never_as_inf(learned)))
  return m if np.isfinite(m) else None


def report(parsed: list[tuple[str, list[pathlib.Path]]], size: int) -> dict:
  """Per label: its determined runs (seeds, learned episodes), undetermined seeds, the count
  learned and, from the second label on, Fisher's exact test (two-sided) of its learned/unlearned
  counts against the first label's."""
  out = {"size": size, "labels": {}}
  first = None
  for label, folders in parsed:
    runs = read_runs(folders, size)
    done = {k: r for k, r in sorted(runs.items()) if r["determined"]}
    if not done:
      raise cli.ConfigError(f"{label!r}: no finished DeepSea-{size} runs under {folders}")
    agents = sorted({r["agent"] for r in runs.values()})
    if len(agents) > 1:
      raise cli.ConfigError(
          f"{label!r}: one label reads one agent's runs, found {', '.join(agents)} under "
          f"{[str(f) for f in folders]} (name each agent's own folder)"
      )
    learned = [r["learned"] for r in done.values()]
    row = dict(
        folders=[str(f) for f in folders],
        agent=agents[0],
        seeds=list(done),
        learned_episode=learned,
        learned=sum(e is not None for e in learned),
        runs=len(done),
        median_learned_episode=median_learned(learned),
        max_episodes=max(r["max_episodes"] for r in done.values()),
        undetermined_seeds=[k for k in sorted(runs) if k not in done],
    )
    counts = [row["learned"], row["runs"] - row["learned"]]
    if first is None:
      first = counts
    else:
      row["fisher_p_vs_first"] = float(scipy.stats.fisher_exact([first, counts]).pvalue)
    out["labels"][label] = row
  return out


def plot(path: pathlib.Path, result: dict) -> None:
  """The fraction of each label's seeds learned against episodes."""
  fig, ax = plt.subplots(figsize=(6.4, 4.0))
  budget = max(r["max_episodes"] for r in result["labels"].values())
  episodes = np.arange(budget + 1)
  for label, r in result["labels"].items():
    frac = learned_fraction(r["learned_episode"], episodes)
    ax.step(episodes, frac, where="post", label=f"{label} ({r['learned']}/{r['runs']})")
  ax.set_xlabel("episode")
  ax.set_ylabel("fraction of seeds learned (bsuite)")
  ax.set_ylim(-0.02, 1.02)
  ax.set_title(f"DeepSea-{result['size']}")
  ax.legend(loc="upper left", fontsize=8)
  ax.grid(alpha=0.3)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def main(argv):
  del argv
  result = report(parse_runs(FLAGS.runs), FLAGS.size)
  out = pathlib.Path(FLAGS.out_dir)
  out.mkdir(parents=True, exist_ok=True)
  for label, r in result["labels"].items():
    line = (
        f"{label}: learned {r['learned']}/{r['runs']}, median episode {r['median_learned_episode']}"
    )
    if "fisher_p_vs_first" in r:
      line += f" (Fisher p = {r['fisher_p_vs_first']:.3g} against the first)"
    if r["undetermined_seeds"]:
      line += f"; undetermined seeds {r['undetermined_seeds']}"
    print(line)
  (out / "learned.json").write_text(json.dumps(result, indent=1))
  plot(out / "learned.png", result)
  print(f"wrote {out / 'learned.json'} and learned.png")


if __name__ == "__main__":
  define_flags()
  cli.run(main)
