"""rl.doom_maps: WAD/ACS parsing, the derived sparse maps, and where envpool really spawns the player."""

import hashlib
import numpy as np
import pytest

from rl import doom_maps as dm
from rl.doom_env import make_env


@pytest.fixture(scope="module")
def stock() -> bytes:
  return dm.stock_map_paths()[0].read_bytes()


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
  return tmp_path_factory.mktemp("vizdoom_maps")


def _behavior(wad_bytes: bytes) -> tuple[int, bytes]:
  """(file offset, data) of MAP01's BEHAVIOR lump."""
  wad = dm.parse_wad(wad_bytes)
  i = dm.map_lump_index(wad, "MAP01", "BEHAVIOR")
  ofs = 12 + sum(
      len(l.data) for l in wad.lumps[:i]
  )  # stock layout: lumps back to back after header
  assert wad_bytes[ofs : ofs + len(wad.lumps[i].data)] == wad.lumps[i].data
  return ofs, wad.lumps[i].data


def test_stock_wad_is_the_known_one(stock):
  assert hashlib.sha256(stock).hexdigest() == dm.STOCK_WAD_SHA256
  wad = dm.parse_wad(stock)
  assert [l.name for l in wad.lumps] == [
      "MAP01",
      "TEXTMAP",
      "BEHAVIOR",
      "DIALOGUE",
      "ZNODES",
      "SCRIPTS",
      "ENDMAP",
  ]


def test_wad_roundtrip_is_exact(stock):
  assert dm.build_wad(dm.parse_wad(stock)) == stock


@pytest.mark.parametrize(
    "data",
    [b"", b"JUNK" + bytes(20), b"PWAD" + (5).to_bytes(4, "little") + (999).to_bytes(4, "little")],
)
def test_parse_wad_rejects_garbage(data):
  with pytest.raises(ValueError):
    dm.parse_wad(data)


def test_stock_behavior_disassembles_to_the_documented_listing(stock):
  _, lump = _behavior(stock)
  beh = dm.parse_behavior(lump)
  assert beh.scripts == {1: (1, 8, 0), 2: (4, 20, 0), 3: (0, 64, 0)}  # OPEN, ENTER, closed
  assert beh.map_vars == {0: 1312 * 65536, 1: 22, 2: 10, 3: 17}
  enter = dm.disassemble(lump, 20)
  assert [dm.Instr(i.name, i.args) for i in enter] == list(dm.STOCK_ENTER)
  assert dm.assemble(enter) == lump[20:64]
  # Script 3 (run by the armor's pickup): reward = 1.0; Exit_Normal(0).
  assert [(i.name, i.args) for i in dm.disassemble(lump, 64)] == [
      ("PUSHNUMBER", (65536,)),
      ("ASSIGNGLOBALVAR", (0,)),
      ("PUSHBYTE", (0,)),
      ("LSPEC1", (243,)),
      ("TERMINATE", ()),
  ]


def test_map_things(stock):
  wad = dm.parse_wad(stock)
  spots = dm.map_spots(wad)
  assert sorted(spots) == list(range(10, 27))
  assert spots[10] == (240.0, -176.0)
  assert spots[15] == pytest.approx((544.0, -672.0), abs=0.2)
  textmap = wad.lumps[dm.map_lump_index(wad, "MAP01", "TEXTMAP")].data.decode("latin-1")
  armor = [t for t in dm.udmf_things(textmap) if t.get("type") == 2018]
  assert (
      len(armor) == 1
      and armor[0]["id"] == dm.GOAL_TID
      and (armor[0]["x"], armor[0]["y"]) == dm.GOAL_XY
  )


@pytest.mark.parametrize("variant", ["sparse", "very_sparse"])
def test_derived_wad_differs_only_in_the_enter_script(stock, variant):
  derived = dm.derive_wad(stock, dm.SPAWNS[variant])
  assert len(derived) == len(stock)
  a, b = dm.parse_wad(stock), dm.parse_wad(derived)
  assert [(l.name, len(l.data)) for l in a.lumps] == [(l.name, len(l.data)) for l in b.lumps]
  ofs, lump = _behavior(derived)
  diff = np.flatnonzero(np.frombuffer(stock, np.uint8) != np.frombuffer(derived, np.uint8))
  assert diff.size > 0 and diff.min() >= ofs + 20 and diff.max() < ofs + 64
  spawn = dm.SPAWNS[variant]
  lo, hi = (round(t * 65536) for t in spawn.angle_turns)
  got = [(i.name, i.args) for i in dm.disassemble(lump, 20)]
  assert got[:3] == [("PUSHBYTE", (spawn.tid,)), ("PUSHBYTE", (spawn.tid,)), ("RANDOM", ())]
  k = got.index(("SETACTORANGLE", ()))
  assert [g[1] for g in got[k - 3 : k - 1]] == [(lo,), (hi,)] and got[k - 1][0] == "RANDOM"
  assert dm.disassemble(lump, 20, 64)[-1].name in ("NOP", "TERMINATE")
  assert dm.parse_behavior(lump) == dm.parse_behavior(_behavior(stock)[1])  # SPTR / MINI untouched


def test_angle_operands():
  assert [round(t * 65536) for t in dm.SPAWNS["sparse"].angle_turns] == [0, 655]
  assert [round(t * 65536) for t in dm.SPAWNS["very_sparse"].angle_turns] == [32113, 33423]


def test_dense_is_the_stock_wad(stock):
  assert dm.derive_wad(stock, None) == stock


def test_patch_refuses_unexpected_scripts(stock):
  ofs, lump = _behavior(stock)
  broken = bytearray(lump)
  broken[21] = 3  # PUSHMAPVAR 2 -> PUSHMAPVAR 3
  with pytest.raises(ValueError, match="stock"):
    dm.patch_behavior(bytes(broken), dm.fixed_spawn_enter(10, (0.0, 0.0)))
  with pytest.raises(ValueError, match="tid"):
    dm.fixed_spawn_enter(300, (0.0, 0.0))
  with pytest.raises(ValueError, match="angle_turns"):
    dm.fixed_spawn_enter(10, (0.6, 0.4))


def test_decode_probe_inverts_the_packing():
  x, y, a = np.array([240, 543, 1120]), np.array([-176, -672, 128]), np.array([0, 255, 511])
  packed = ((x * 2048) + (y + 1024)) * 512 + a
  assert packed.max() < 2**31
  gx, gy, ga = dm.decode_probe(packed.astype(np.float64))
  np.testing.assert_array_equal(gx, x)
  np.testing.assert_array_equal(gy, y)
  np.testing.assert_allclose(ga, a / 512)


def test_variant_files_are_cached_idempotently(cache):
  f1 = dm.variant_files("very_sparse", cache)
  mtime = f1.wad.stat().st_mtime_ns
  f2 = dm.variant_files("very_sparse", cache)
  assert f1 == f2 and f2.wad.stat().st_mtime_ns == mtime
  assert hashlib.sha256(f2.wad.read_bytes()).hexdigest() == f2.sha256
  assert f"doom_scenario_path = {f2.wad.name}" in f2.cfg.read_text()


def test_unknown_variant_is_a_value_error(cache):
  with pytest.raises(ValueError, match="variant"):
    dm.variant_files("medium", cache)


# ---------------------------------------------------------------------------------------------
# Where the engine really puts the player (probe maps report the pose through USER2).


def _spawn_poses(variant, num_envs, cache):
  pytest.importorskip("envpool")

  env = make_env(variant, num_envs, seed=3, cache_dir=cache, probe=True)
  try:
    _, info = env.reset()
    return [np.asarray(p) for p in info["pose"]]
  finally:
    env.close()


@pytest.mark.parametrize(
    "variant,xy,angle",
    [
        ("sparse", (240, -176), (0.0, 0.01)),
        ("very_sparse", (543, -672), (0.49, 0.51)),  # spot x 543.986 (probe truncates toward 0)
    ],
)
def test_sparse_variants_spawn_at_their_spot(variant, xy, angle, cache):
  x, y, a = _spawn_poses(variant, 4, cache)
  np.testing.assert_array_equal(x, xy[0])
  np.testing.assert_array_equal(y, xy[1])
  assert np.all((a >= angle[0] - 1 / 512) & (a <= angle[1])), a


def test_dense_spawns_vary_over_map_spots(stock, cache):
  x, y, a = _spawn_poses("dense", 12, cache)
  spots = np.array(list(dm.map_spots(dm.parse_wad(stock)).values()))
  d = np.hypot(x[:, None] - spots[None, :, 0], y[:, None] - spots[None, :, 1]).min(axis=1)
  assert np.all(d < 1.5), d  # every spawn is on a map spot
  assert len({(int(i), int(j)) for i, j in zip(x, y)}) >= 5  # 12 draws from 17 spots
  assert np.ptp(a) > 0.25  # random angle over the full turn
