"""Synthetic many-model routing tables with known structure, from the routing simulator's catalogue.

Each prompt is a task for one of SAGE's roles (its topic, the ``eval_name``) with a latent
complexity ``c``; model ``k`` gets it right with the routing simulator's probability
``p = sigmoid(sharpness * (skill[k, role] - c))`` (``sage_pipeline.routing.routing_simulator``,
sharpness 8 there and by default here), where ``skill`` is the catalogue's capability plus a
fixed per-(model, role) deviation (``specialisation``), so the best model differs by role. The
models are the catalogue's six
(``data/model_catalogue.yaml``: capability per role, USD per call + per 1k prompt tokens) and
:data:`EXTRA_MODELS`, five more in the same form with prices near public list prices, so a
table has up to 11 models from $0.0002 to $0.06 per call. A model without a capability for a
role is out of its depth there (:data:`NO_SKILL`).

The prompt text carries the role's vocabulary and a word for the task's level (ten levels of
the complexity, plus unobserved noise ``hidden_noise``), and grows with the complexity, so a
router reading the text can learn most, not all, of ``p``. Quality is binary (a Bernoulli
draw of ``p``) or graded (a Beta draw with mean ``p``: a judge's score in [0, 1]). The true
``p`` is returned beside the table: routing by ``p - w * cost`` is the best any router can do
without seeing the outcomes (the ``bayes`` router), the oracle (which sees them) bounds it.

Tables are written in RouterBench's wide layout (``sample_id``, ``prompt``, ``eval_name``, one
quality column per model, ``<model>|total_cost``) with ``DataFrame.to_csv``'s default index, as
such tables are shipped.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field

from sage_pipeline.routing.catalogue import ModelCatalogue
from sage_pipeline.routing.schema import ROLES

# Five models beyond the catalogue's six, in its form (capability per role; USD per call and per
# 1k prompt tokens, near 2024-25 public list prices for a call with a few hundred output tokens).
EXTRA_MODELS: dict[str, dict] = {
    "gpt-4o": {"cost_per_call": 0.005, "cost_per_1k_prompt_tokens": 0.0025,
               "capability": {"planner": 0.80, "architect": 0.76, "coder": 0.78, "debugger": 0.74,
                              "reviewer": 0.80, "test_engineer": 0.74, "documentation": 0.82,
                              "memory_optimizer": 0.72}},
    "deepseek-v3": {"cost_per_call": 0.0006, "cost_per_1k_prompt_tokens": 0.00027,
                    "capability": {"planner": 0.70, "architect": 0.68, "coder": 0.82, "debugger": 0.76,
                                   "reviewer": 0.66, "test_engineer": 0.72, "documentation": 0.60,
                                   "memory_optimizer": 0.58}},
    "gemini-1.5-flash": {"cost_per_call": 0.0002, "cost_per_1k_prompt_tokens": 0.000075,
                         "capability": {"planner": 0.55, "architect": 0.50, "coder": 0.52, "debugger": 0.48,
                                        "reviewer": 0.60, "test_engineer": 0.50, "documentation": 0.72,
                                        "memory_optimizer": 0.70}},
    "llama-3.1-70b": {"cost_per_call": 0.0009, "cost_per_1k_prompt_tokens": 0.00088,
                      "capability": {"planner": 0.66, "architect": 0.60, "coder": 0.64, "debugger": 0.58,
                                     "reviewer": 0.68, "test_engineer": 0.62, "documentation": 0.74,
                                     "memory_optimizer": 0.68}},
    "mixtral-8x7b": {"cost_per_call": 0.0006, "cost_per_1k_prompt_tokens": 0.0006,
                     "capability": {"planner": 0.50, "architect": 0.46, "coder": 0.55, "debugger": 0.45,
                                    "reviewer": 0.55, "test_engineer": 0.52, "documentation": 0.66,
                                    "memory_optimizer": 0.60}},
}
NO_SKILL = 0.25  # capability of a model for a role the catalogue gives it none for
LEVELS = ("trivial", "simple", "routine", "standard", "moderate", "involved", "hard", "advanced", "expert",
          "research")
VOCAB = {
    "planner": "plan milestones schedule roadmap dependencies scope priorities estimate phases deliverables risks",
    "architect": "architecture services interfaces modules scalability database schema boundaries coupling design",
    "coder": "implement function class parser algorithm loop recursion api endpoint refactor compile",
    "debugger": "bug crash stacktrace exception segfault regression race deadlock reproduce bisect traceback",
    "reviewer": "review diff style readability naming comments approve nit suggestion pull request",
    "test_engineer": "tests pytest fixtures coverage mocks assertions edge cases property fuzzing flaky",
    "documentation": "docs readme tutorial guide docstring changelog examples reference explain markdown",
    "memory_optimizer": "memory summary compress context notes recall consolidate forget skills knowledge",
}
FILLER = "the a of to in for with on this that project team code system user please need our".split()


class SyntheticConfig(BaseModel):
    """A synthetic table's size, models and noise."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    n_prompts: int = Field(6000, ge=20, description="prompts (rows), at least 20")
    n_models: int = Field(11, ge=2, le=6 + len(EXTRA_MODELS), description="the catalogue's six first, then "
                          f"EXTRA_MODELS in order (8: six + two), in [2, {6 + len(EXTRA_MODELS)}]")
    quality: Literal["binary", "graded"] = Field("binary", description="binary (Bernoulli(p)) or graded (Beta with "
                                                 "mean p)")
    sharpness: float = Field(8.0, gt=0.0, description="the routing simulator's slope of the success logit in "
                             "capability - complexity (> 0)")
    hidden_noise: float = Field(0.05, ge=0.0, description="std of the complexity the prompt text does not show")
    graded_concentration: float = Field(12.0, gt=0.0, description="k of the graded quality's Beta(p k, (1 - p) k)")
    specialisation: float = Field(0.15, ge=0.0, description="std of a fixed per-(model, role) deviation added to the "
                                  "catalogue's capabilities (drawn with world_seed, the same for every table): makes "
                                  "different models best at different roles")
    world_seed: int = Field(0, description="seed of the specialisation")
    seed: int = Field(0, description="seed of the prompts and outcomes")


def catalogue_models(n_models: int, catalogue: ModelCatalogue | None = None) -> ModelCatalogue:
    """The catalogue's models, then EXTRA_MODELS, the first ``n_models`` of them."""
    cat = catalogue or ModelCatalogue.load()
    doc = {"models": {m.name: {"cost_per_call": m.cost_per_call,
                               "cost_per_1k_prompt_tokens": m.cost_per_1k_prompt_tokens,
                               "capability": dict(m.capability)} for m in cat.models} | EXTRA_MODELS}
    names = list(doc["models"])[:n_models]
    return ModelCatalogue.from_dict({"models": {n: doc["models"][n] for n in names}}, source="synthetic")


def make_synthetic(cfg: SyntheticConfig = SyntheticConfig(),
                   catalogue: ModelCatalogue | None = None) -> tuple[pd.DataFrame, np.ndarray]:
    """(the table in RouterBench's wide layout, the true success probability ``p`` (n, K))."""
    rng = np.random.default_rng(cfg.seed)
    cat = catalogue_models(cfg.n_models, catalogue)
    models = cat.actions
    n, K = cfg.n_prompts, len(models)
    cap = np.nan_to_num(cat.capability_matrix(), nan=NO_SKILL)  # (roles, K)
    world = np.random.default_rng(cfg.world_seed).normal(0.0, 1.0, (len(ROLES), 6 + len(EXTRA_MODELS)))[:, :K]
    cap = np.clip(cap + cfg.specialisation * world, 0.0, 1.0)
    role = rng.integers(0, len(ROLES), n)
    c_seen = rng.uniform(0.15, 0.95, n)
    level = np.minimum((c_seen - 0.15) / 0.8 * len(LEVELS), len(LEVELS) - 1).astype(int)
    c_true = c_seen + rng.normal(0.0, cfg.hidden_noise, n)
    p = 1.0 / (1.0 + np.exp(-cfg.sharpness * (cap[role] - c_true[:, None])))
    if cfg.quality == "binary":
        quality = (rng.random((n, K)) < p).astype(float)
    else:
        k = cfg.graded_concentration
        quality = rng.beta(np.maximum(p * k, 1e-3), np.maximum((1 - p) * k, 1e-3))
    words = rng.integers(6, 14, n) + (12 * c_seen).astype(int)  # harder tasks are described at more length
    vocab = {r: VOCAB[r].split() for r in ROLES}
    prompts = []
    for i in range(n):
        r = ROLES[role[i]]
        body = rng.choice(vocab[r], words[i]).tolist() + rng.choice(FILLER, words[i] // 2).tolist()
        rng.shuffle(body)
        prompts.append(f"{LEVELS[level[i]]} {r.replace('_', ' ')} task: " + " ".join(body))
    tokens = np.array([len(t) for t in prompts], dtype=np.float64) / 4.0 * 20  # a task's context: ~20x its text
    cost = np.column_stack([cat.cost_usd(np.full(n, k), tokens) for k in range(K)])
    df = pd.DataFrame({"sample_id": [f"syn{cfg.seed}.{i}" for i in range(n)], "prompt": prompts,
                       "eval_name": [ROLES[r] for r in role]})
    for k, m in enumerate(models):
        df[m] = quality[:, k]
        df[f"{m}|total_cost"] = cost[:, k]
    return df, p


def write_synthetic(folder: str | Path, cfg: SyntheticConfig = SyntheticConfig()) -> tuple[Path, np.ndarray]:
    """Write the table as ``folder/synthetic_<K>m_<quality>_sharpness<s>.csv`` (pandas' default index included)."""
    df, p = make_synthetic(cfg)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"synthetic_{cfg.n_models}m_{cfg.quality}_sharpness{cfg.sharpness:g}.csv"
    df.to_csv(path)
    return path, p
