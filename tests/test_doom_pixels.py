"""The paper's VizDoom view (42x42 gray, a 6-frame stack, no frame skip) on recorded frames.

``tests/data/doom_frames.npz`` holds frames of one Sparse-spawn episode (seed 0, walking
forward) recorded by ``record`` (``python tests/test_doom_pixels.py`` rewrites it): the
42x42 gray stacks the agent sees, and the same frames at the game's 320x240, gray and RGB.
"""

from pathlib import Path

import numpy as np
import pytest

from rl import doom_env

FRAMES = Path(__file__).parent / "data" / "doom_frames.npz"
STEPS = 2  # forward steps after the reset


def record(work_dir) -> dict[str, np.ndarray]:
  """The frames of ``FRAMES``: ``small`` uint8 (STEPS+1, 6, 42, 42) (``PAPER_PIXELS``), and at
  the game's resolution ``gray`` (STEPS+1, 240, 320) and ``rgb`` (3, 240, 320) (the reset)."""

  def run(pixels, **size):
    env = doom_env.make_env("sparse", 1, 0, work_dir=work_dir, pixels=pixels, **size)
    forward = np.array([doom_env.doom_action("MOVE_FORWARD", pixels.actions)])
    try:
      obs = [env.reset()[0][0]]
      obs += [env.step(forward).obs[0] for _ in range(STEPS)]
    finally:
      env.close()
    return np.stack(obs)

  full = dict(img_height=240, img_width=320)
  one = lambda gray: doom_env.DoomPixels(size=42, stack=1, gray=gray, frame_skip=1)  # noqa: E731
  return dict(
      small=run(doom_env.PAPER_PIXELS),
      gray=run(one(True), **full)[:, 0],
      rgb=run(one(False), **full)[0],
  )


def area_resize(image: np.ndarray, height: int, width: int) -> np.ndarray:
  """Area-average downscaling (OpenCV's INTER_AREA): each output pixel is the mean of the input
  area it covers, partly covered pixels weighted by the covered fraction. float64."""

  def weights(n_in, n_out):
    scale, w = n_in / n_out, np.zeros((n_out, n_in))
    for j in range(n_out):
      lo, hi = j * scale, (j + 1) * scale
      for i in range(int(lo), min(n_in, int(np.ceil(hi)))):
        w[j, i] = min(hi, i + 1) - max(lo, i)
    return w / scale

  return (
      weights(image.shape[0], height) @ image.astype(np.float64) @ weights(image.shape[1], width).T
  )


@pytest.fixture(scope="module")
def frames():
  return dict(np.load(FRAMES))


def test_paper_pixels_are_the_papers_view():
  p = doom_env.PAPER_PIXELS
  assert p.obs_shape == (6, 42, 42) and p.frame_skip == 1 and p.actions == 5
  assert p.max_episode_steps == doom_env.EPISODE_FRAMES == 2100
  assert doom_env.NATURE_PIXELS.max_episode_steps * doom_env.NATURE_PIXELS.frame_skip == 2100
  with pytest.raises(ValueError, match="frame_skip must divide"):
    doom_env.DoomPixels(frame_skip=8)


def test_42x42_frames_are_the_area_average_of_the_full_gray_frame(frames):
  small, gray = frames["small"], frames["gray"]
  assert small.shape == (STEPS + 1, 6, 42, 42) and small.dtype == np.uint8
  for t in range(STEPS + 1):  # the newest frame is the last channel
    np.testing.assert_array_equal(small[t, -1], np.round(area_resize(gray[t], 42, 42)))
  assert not np.array_equal(small[1, -1], small[0, -1])  # the agent moved


def test_gray_is_the_luma_of_the_rgb_frame(frames):
  luma = np.tensordot(np.array([0.299, 0.587, 0.114]), frames["rgb"].astype(np.float64), axes=1)
  diff = np.abs(luma - frames["gray"][0])
  assert diff.mean() < 1.0 and diff.max() <= 4.0


def test_the_stack_holds_the_last_six_frames_oldest_first(frames):
  small = frames["small"]
  assert all(np.array_equal(small[0, i], small[0, -1]) for i in range(6))  # reset: repeated
  for t in range(STEPS):
    np.testing.assert_array_equal(small[t + 1, :-1], small[t, 1:])


def test_envpool_gives_the_recorded_frames(frames, tmp_path):
  pytest.importorskip("envpool")
  live = record(tmp_path)
  for name in ("small", "gray", "rgb"):
    np.testing.assert_array_equal(live[name], frames[name], err_msg=name)


if __name__ == "__main__":
  import tempfile

  with tempfile.TemporaryDirectory() as tmp:
    np.savez_compressed(FRAMES, **record(tmp))
  print(f"wrote {FRAMES} ({FRAMES.stat().st_size} bytes)")
