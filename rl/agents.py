"""The one registry of the RL agents, their parts and the envs' variants.

Every other module (``rl.dqn``, ``rl.run_config``, the drivers, ``configs/``, ``benchmarks/``)
reads the agent names, what each agent is built from and the VizDoom variants and settings
from here.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Agent:
  """One DQN-family agent: what its learner (``rl.dqn``) is built from."""

  name: str
  bonus: str = "none"  # the intrinsic reward's estimator: "none", "csd" or "rnd" (rl.bonus)
  # The CSD paper's form: the bonus scores state-action pairs, trains a separate intrinsic
  # value head with the reward prior, and acting is greedy in Q_ext + β Q̂_in.
  state_action: bool = False
  heads: bool = False  # BDQN+P: K heads with additive random priors and bootstrap masks

  @property
  def deep_csd(self) -> bool:
    """Whether the CSD bonus is deep CSD (trained towers φ, ψ) rather than linear CSD."""
    return self.bonus == "csd" and self.state_action

  @property
  def parts(self) -> tuple[str, ...]:
    """The sub-configs a run config of this agent holds besides ``dqn``: ``bonus`` with
    ``csd`` or ``rnd`` (the intrinsic reward), ``bdqn`` (heads and priors)."""
    return (("bonus", self.bonus) if self.bonus != "none" else ()) + (
        ("bdqn",) if self.heads else ()
    )


AGENTS = {
    a.name: a
    for a in (
        Agent("dqn"),  # ε-greedy double DQN
        Agent("csd", bonus="csd"),  # DQN + the CSD bonus of the next observation
        Agent("rnd", bonus="rnd"),  # DQN + the RND bonus of the next observation
        Agent("bdqn", heads=True),
        Agent("csd_sa", bonus="csd", state_action=True),  # the CSD paper's agent
        Agent("rnd_sa", bonus="rnd", state_action=True),  # its RND twin
    )
}
NAMES = tuple(AGENTS)
# Every sub-config an agent may hold (``Agent.parts``).
PARTS = ("bonus", "csd", "rnd", "bdqn")

# Where a VizDoom MyWayHome agent starts (``rl.doom_maps``): a random spot, or fixed spots
# further from the armor.
VARIANTS = ("dense", "sparse", "very_sparse")
# What a VizDoom agent sees and the size of its nets (``configs/vizdoom.py``).
SETTINGS = ("cpu", "paper", "nature")
# The setting of a VizDoom profile that leaves it to JAX's backend (``rl.vizdoom`` decides it
# once JAX has started).
AUTO = "auto"
