"""Random network distillation (Burda et al. 2019) as an OOD score.

A target net t (the backbone with an ``embed_dim`` head, at its random init, fixed) and a
predictor p (same architecture, own init) trained by squared error to match t on the training
images, with the same budget as a classifier. Score: ‖p(x) − t(x)‖² / embed_dim. RND has no
classifier of its own: ``predict`` uses a plain classifier of the same backbone and budget.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import optax

from csd_jax import checkpoint
from csd_jax import models
from csd_jax import train
from csd_jax.baselines import common
from csd_jax.baselines.common import MethodState


def default_config() -> dict:
  return {**common.common_config(), "embed_dim": 64}


def _spec(config):
  return train.spec_from_config(config["backbone"], out_dim=int(config["embed_dim"]))


@functools.lru_cache(maxsize=16)
def _fns(spec, lr, weight_decay, num_steps, batch_size):
  net = models.module(spec)
  tx = train.optimizer(lr, weight_decay, num_steps)

  def step(carry, key):
    params, opt_state, target, images = carry
    idx = jax.random.randint(key, (batch_size,), 0, images.shape[0])
    x = images[idx]
    y = net.apply(target, x)

    def loss(p):
      return jnp.mean(jnp.sum((net.apply(p, x) - y) ** 2, -1))

    value, grads = jax.value_and_grad(loss)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return (optax.apply_updates(params, updates), opt_state, target, images), value

  return net, tx, jax.jit(step)


def fit(key, data, config, context=None, run: train.RunOptions = train.DEFAULT_RUN
        ) -> MethodState:
  del context
  config = train.freeze(config)
  kw = common.train_kwargs(config)
  k_target, k_pred, k_loop = jax.random.split(key, 3)
  k_cls = common.classifier_key(key)
  net, tx, step = _fns(_spec(config), kw["lr"], kw["weight_decay"], kw["num_steps"],
                       kw["batch_size"])
  images = jnp.asarray(data.images)
  target = net.init(k_target, images[:1])
  params = net.init(k_pred, images[:1])
  ckpt = run.sub("predictor").periodic(lambda: dict(
      kind="rnd", config=train.to_json(config), key=checkpoint.key_id(key),
      data=checkpoint.fingerprint(images)))
  (params, _, _, _), _ = train.fit_loop(step, (params, tx.init(params), target, images),
                                        jax.random.split(k_loop, kw["num_steps"]), ckpt)
  classifier, _ = train.cached_classifier(k_cls, common.classifier_spec(config), data.images,
                                          data.labels, run=run.sub("classifier"), **kw)
  return MethodState(arrays={"predictor": params, "target": target, "classifier": classifier},
                     config=config)


def score(state: MethodState, x) -> jax.Array:
  net = models.module(_spec(state.config))
  diff = net.apply(state.arrays["predictor"], x) - net.apply(state.arrays["target"], x)
  return jnp.mean(diff ** 2, axis=-1)


def predict(state: MethodState, x) -> jax.Array:
  net = models.module(common.classifier_spec(state.config))
  return jax.nn.softmax(net.apply(state.arrays["classifier"], x), axis=-1)
