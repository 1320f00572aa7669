"""The three VizDoom *MyWayHome* variants of Pathak et al. (2017), derived from the stock WAD.

Curiosity-driven exploration (Pathak et al., 2017, Sec. 4) uses three versions of the same
map: *dense* (spawn at one of 17 spots, uniformly at random), *sparse* (always spawn in the
room of map spot TID 10, ~270 steps from the goal) and *very sparse* (always spawn at map spot
TID 15, ~350 steps from the goal, the farthest room). Geometry, goal and reward are the same in
all three; only the spawn differs. This module builds the two sparse maps at run time from the
stock ``my_way_home.wad`` that ``envpool-assets`` ships, by rewriting the map's compiled ACS.

What the stock WAD contains (PWAD, 7 lumps, sha256 ``18e98ff4...c0b1``, 28,469 bytes)
-------------------------------------------------------------------------------------
``MAP01 TEXTMAP BEHAVIOR DIALOGUE ZNODES SCRIPTS ENDMAP``: a UDMF map. ``TEXTMAP`` has the
armor (type 2018, green armor, TID 22, at x 1040, y -352) and 17 map spots (type 9001, TIDs
10..26; a second thing with TID 22 is a map spot at (694, 58)). ``SCRIPTS`` is the ACS source
(not executed by the engine; left untouched here); ``BEHAVIOR`` (200 bytes) is the compiled
ACS the engine runs. Its header is ``"ACS\\0"`` with the directory offset 156, and the 4 bytes
before offset 156 read ``"ACSe"``: the *little-enhanced* (compressed) format, whose chunks
start at the offset stored just before the tag (88): ``SPTR`` (script pointers: script 1
OPEN at 8, script 2 ENTER at 20, script 3 closed at 64) and ``MINI`` (map-variable
initialisers: var0 = 1312.0 (``armour_x``), var1 = 22 (``armour_tid``), var2 = 10
(``map_point_start_id``), var3 = 17 (``map_points``)). In this format a p-code is one byte
(two when the first byte is >= 240: ``pcd = 240 + ((b0 - 240) << 8) + b1``) and variable
indices, ``PUSHBYTE`` / ``PUSH2BYTES`` operands and line specials are single bytes;
``PUSHNUMBER`` and ``GOTO`` take a 4-byte little-endian word.

The stock ENTER script (BEHAVIOR bytes 20..63, 44 bytes) disassembles to::

    20 PUSHMAPVAR 2          \\
    22 PUSHMAPVAR 2           |  Random(map_point_start_id,
    24 PUSHMAPVAR 3           |         map_point_start_id + map_points - 1)
    26 ADD                    |  = Random(10, 26)
    27 PUSHBYTE 1             |
    29 SUBTRACT               |
    30 RANDOM                /
    31 ASSIGNSCRIPTVAR 0        target_id = ...
    33 PUSHBYTE 0               SetActorPosition(0, GetActorX(target_id),
    35 PUSHSCRIPTVAR 0; GETACTORX; PUSHSCRIPTVAR 0; GETACTORY
    41 PUSH2BYTES 0 0                            GetActorY(target_id), 0.0, 0)
    44 SETACTORPOSITION; DROP
    47 PUSH2BYTES 0 0           SetActorAngle(0, Random(0.0, 1.0))   (tid 0; min 0)
    50 PUSHNUMBER 65536                                               (max 1.0 in 16.16)
    55 RANDOM; SETACTORANGLE
    58 PUSHBYTE 0; ASSIGNGLOBALVAR 0; CLEARINVENTORY; TERMINATE       reward = 0; ...

(The OPEN script gives the armor the special ``ACS_ExecuteAlways(3)``; script 3 sets the global
``reward = 1.0`` and runs ``Exit_Normal(0)``: picking up the armor ends the level at once.)

Angles are 16.16 fixed-point *turns* (``SetActorAngle`` shifts them into a 32-bit BAM:
65536 = 360 degrees; 0 = east, 0.25 = north, 0.5 = west). The engine's ``Random(lo, hi)`` is
inclusive.

What is changed, and why
------------------------
Only the ENTER script body (BEHAVIOR bytes 20..63) is rewritten, in place, to the same length;
every other byte of the WAD (all other lumps, the lump directory, SPTR, MINI, the other two
scripts) is unchanged. The script is disassembled, checked against the listing above (so a
different asset version fails loudly instead of being mis-patched), and the operands of the two
``RANDOM`` calls are replaced (the ``PUSH2BYTES`` that mixes SetActorAngle's tid with Random's
min is split into two ``PUSHBYTE`` first):

* spawn: ``Random(mapvar2, mapvar2 + mapvar3 - 1)`` -> ``Random(T, T)`` (two ``PUSHBYTE T``);
* angle: ``Random(0.0, 1.0)`` -> ``Random(lo, hi)`` with ``lo, hi = round(turns * 65536)``.

============  ===  ============  ===========================  ======================
variant       T    spot (x, y)   angle (turns)                Random operands
============  ===  ============  ===========================  ======================
sparse        10   (240, -176)   0.00 .. 0.01 (east)          (10, 10), (0, 655)
very_sparse   15   (544, -672)   0.49 .. 0.51 (west)          (15, 15), (32113, 33423)
============  ===  ============  ===========================  ======================

The re-assembled script is shorter (40 and 43 bytes), so it is padded with ``NOP`` after its
``TERMINATE`` (never executed); no offset anywhere moves, no lump size changes. 39 bytes of the
WAD differ from stock in either variant, all inside BEHAVIOR[20:64].

A *probe* option (for tests and analysis only) additionally appends a loop to the ENTER script
that writes the player's position and angle every tic into ACS global 2, which ViZDoom reports
as game variable ``USER2``: one of the 16 fixed game variables envpool puts into ``info`` (it
ignores the cfg's ``available_game_variables`` for ``info``, so ``POSITION_X`` cannot be read
there). The probe's code is appended after the old lump end and script 2's SPTR address
points to it, so the lump grows and the WAD directory is rewritten. ``decode_probe`` inverts
the packing ``((x << 11) + (y + 1024)) << 9 | angle >> 7`` (x, y in whole map units, which fits
the map's bounds x 160..1120, y -704..128).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import os
import re
import struct
import tempfile
from pathlib import Path
from typing import NamedTuple, Sequence

import numpy as np

from rl import agents

STOCK_WAD_SHA256 = "18e98ff4c9186808eb00696b799cfe88a79e7486429c1692aafbed8ef359c0b1"
GOAL_TID = 22
GOAL_XY = (1040.0, -352.0)
DEFAULT_CACHE_DIR = Path("~/.cache/csd_jax/vizdoom")
FIXED_ONE = 65536  # 1.0 in ACS 16.16 fixed point (= one full turn for angles)


@dataclasses.dataclass(frozen=True)
class Spawn:
  """A fixed spawn: map spot TID and an inclusive angle range in turns (0 = east, 0.5 = west)."""

  tid: int
  angle_turns: tuple[float, float]


SPAWNS = {
    "sparse": Spawn(tid=10, angle_turns=(0.0, 0.01)),
    "very_sparse": Spawn(tid=15, angle_turns=(0.49, 0.51)),
}


def check_variant(variant: str) -> str:
  """Returns ``variant`` or raises ValueError naming the argument and the allowed values."""
  if variant not in agents.VARIANTS:
    raise ValueError(f"variant must be one of {agents.VARIANTS}, got {variant!r}")
  return variant


# ----------------------------------------------------------------------------------------------
# Stock files.


def stock_map_paths() -> tuple[Path, Path]:
  """(wad, cfg) paths of the stock ``my_way_home`` map shipped by the ``envpool-assets`` package."""
  spec = importlib.util.find_spec("envpool_assets")
  if spec is None or not spec.submodule_search_locations:
    raise FileNotFoundError("package envpool-assets (which ships my_way_home.wad) is not installed")
  for root in spec.submodule_search_locations:
    maps = Path(root) / "vizdoom" / "maps"
    wad, cfg = maps / "my_way_home.wad", maps / "my_way_home.cfg"
    if wad.is_file() and cfg.is_file():
      return wad, cfg
  raise FileNotFoundError(f"my_way_home.wad/.cfg not found under {spec.submodule_search_locations}")


# ----------------------------------------------------------------------------------------------
# WAD container.


class Lump(NamedTuple):
  name: str
  data: bytes


class Wad(NamedTuple):
  ident: bytes  # b"PWAD" or b"IWAD"
  lumps: tuple[Lump, ...]

  def index(self, name: str, after: int = 0) -> int:
    """Index of the first lump called ``name`` at or after ``after``; KeyError if none."""
    for i in range(after, len(self.lumps)):
      if self.lumps[i].name == name:
        return i
    raise KeyError(f"no lump {name!r} after index {after}")


def parse_wad(data: bytes) -> Wad:
  """Parses a WAD: 12-byte header (ident, lump count, directory offset), 16-byte entries."""
  if len(data) < 12:
    raise ValueError(f"data is not a WAD: {len(data)} bytes")
  ident, count, dir_ofs = struct.unpack_from("<4sii", data, 0)
  if ident not in (b"PWAD", b"IWAD"):
    raise ValueError(f"data is not a WAD: ident {ident!r}")
  if count < 0 or dir_ofs < 12 or dir_ofs + 16 * count > len(data):
    raise ValueError(f"bad WAD directory: {count} lumps at {dir_ofs}, file size {len(data)}")
  lumps = []
  for i in range(count):
    ofs, size, name = struct.unpack_from("<ii8s", data, dir_ofs + 16 * i)
    if ofs < 0 or size < 0 or ofs + size > len(data):
      raise ValueError(f"lump {i} ({name!r}) out of bounds: {ofs}+{size} > {len(data)}")
    lumps.append(Lump(name.rstrip(b"\0").decode("ascii"), data[ofs : ofs + size]))
  return Wad(ident, tuple(lumps))


def build_wad(wad: Wad) -> bytes:
  """Serialises ``wad``: header, lump data in order, directory at the end (as the stock file).

  ``build_wad(parse_wad(b)) == b`` for WADs laid out that way (the stock one is).
  """
  body = bytearray()
  entries = []
  for lump in wad.lumps:
    # Empty marker lumps (MAP01, ENDMAP) point at the current end, as deutex/UDB write them.
    entries.append((12 + len(body), len(lump.data), lump.name.encode("ascii").ljust(8, b"\0")))
    body += lump.data
  dir_ofs = 12 + len(body)
  out = bytearray(struct.pack("<4sii", wad.ident, len(wad.lumps), dir_ofs)) + body
  for ofs, size, name in entries:
    out += struct.pack("<ii8s", ofs, size, name)
  return bytes(out)


def replace_lump(wad: Wad, index: int, data: bytes) -> Wad:
  """A copy of ``wad`` with lump ``index``'s data replaced (sizes and offsets follow)."""
  lumps = list(wad.lumps)
  lumps[index] = Lump(lumps[index].name, bytes(data))
  return Wad(wad.ident, tuple(lumps))


def map_lump_index(wad: Wad, map_name: str, lump_name: str) -> int:
  """Index of lump ``lump_name`` (e.g. BEHAVIOR) of map ``map_name`` (UDMF: before ENDMAP)."""
  start = wad.index(map_name)
  for i in range(start + 1, len(wad.lumps)):
    if wad.lumps[i].name == lump_name:
      return i
    if wad.lumps[i].name == "ENDMAP":
      break
  raise KeyError(f"map {map_name} has no {lump_name} lump")


def udmf_things(textmap: str) -> list[dict[str, float]]:
  """The ``thing`` blocks of a UDMF TEXTMAP as dicts of their numeric fields (id, x, y, angle, type)."""
  things = []
  for block in re.findall(r"\bthing\b[^{]*\{([^}]*)\}", textmap):
    fields = dict(re.findall(r"(\w+)\s*=\s*(-?[\d.]+)\s*;", block))
    things.append({k: float(v) for k, v in fields.items()})
  return things


def map_spots(wad: Wad, map_name: str = "MAP01") -> dict[int, tuple[float, float]]:
  """TID -> (x, y) of the map spots (thing type 9001) in ``map_name``, in map units."""
  textmap = wad.lumps[map_lump_index(wad, map_name, "TEXTMAP")].data.decode("latin-1")
  return {
      int(t["id"]): (t["x"], t["y"])
      for t in udmf_things(textmap)
      if t.get("type") == 9001 and "id" in t
  }


# ----------------------------------------------------------------------------------------------
# ACS (BEHAVIOR lump), little-enhanced "ACSe" format: just the p-codes this map uses.

# p-code number -> (name, operand layout). Layout letters: "b" 1 byte, "w" 4-byte word,
# "n" byte count followed by that many bytes. Stack effect: (pops, pushes); None = see code.
_PCODES: dict[int, tuple[str, str, tuple[int, int]]] = {
    0: ("NOP", "", (0, 0)),
    1: ("TERMINATE", "", (0, 0)),
    3: ("PUSHNUMBER", "w", (0, 1)),
    4: ("LSPEC1", "b", (1, 0)),
    14: ("ADD", "", (2, 1)),
    15: ("SUBTRACT", "", (2, 1)),
    16: ("MULTIPLY", "", (2, 1)),
    17: ("DIVIDE", "", (2, 1)),
    25: ("ASSIGNSCRIPTVAR", "b", (1, 0)),
    26: ("ASSIGNMAPVAR", "b", (1, 0)),
    28: ("PUSHSCRIPTVAR", "b", (0, 1)),
    29: ("PUSHMAPVAR", "b", (0, 1)),
    52: ("GOTO", "w", (0, 0)),
    54: ("DROP", "", (1, 0)),
    57: ("RANDOM", "", (2, 1)),
    142: ("CLEARINVENTORY", "", (0, 0)),
    167: ("PUSHBYTE", "b", (0, 1)),
    173: ("DELAYDIRECTB", "b", (0, 0)),
    175: ("PUSHBYTES", "n", (0, -1)),  # pushes its byte count
    176: ("PUSH2BYTES", "bb", (0, 2)),
    177: ("PUSH3BYTES", "bbb", (0, 3)),
    178: ("PUSH4BYTES", "bbbb", (0, 4)),
    179: ("PUSH5BYTES", "bbbbb", (0, 5)),
    180: ("SETTHINGSPECIAL", "", (7, 0)),
    181: ("ASSIGNGLOBALVAR", "b", (1, 0)),
    182: ("PUSHGLOBALVAR", "b", (0, 1)),
    196: ("GETACTORX", "", (1, 1)),
    197: ("GETACTORY", "", (1, 1)),
    260: ("GETACTORANGLE", "", (1, 1)),
    276: ("SETACTORANGLE", "", (2, 0)),
    283: ("SETACTORPOSITION", "", (5, 1)),
}
_OPCODE = {name: code for code, (name, _, _) in _PCODES.items()}


class Instr(NamedTuple):
  """One ACS instruction: p-code name and integer operands (``offset`` = byte offset in the lump)."""

  name: str
  args: tuple[int, ...] = ()
  offset: int = -1


def _read_pcode(code: bytes, pos: int) -> tuple[int, int]:
  b0 = code[pos]
  if b0 >= 240:
    return 240 + ((b0 - 240) << 8) + code[pos + 1], pos + 2
  return b0, pos + 1


def disassemble(lump: bytes, start: int, stop: int | None = None) -> list[Instr]:
  """Disassembles little-enhanced ACS from ``start`` through the first TERMINATE (or to ``stop``).

  Raises ValueError on a p-code outside the small table this module knows.
  """
  out, pos = [], start
  while pos < (len(lump) if stop is None else stop):
    at = pos
    pcode, pos = _read_pcode(lump, pos)
    if pcode not in _PCODES:
      raise ValueError(f"unknown ACS p-code {pcode} at BEHAVIOR offset {at}")
    name, layout, _ = _PCODES[pcode]
    args = []
    for kind in layout:
      if kind == "w":
        args.append(struct.unpack_from("<i", lump, pos)[0])
        pos += 4
      elif kind == "b":
        args.append(lump[pos])
        pos += 1
      elif kind == "n":
        n = lump[pos]
        args.extend(lump[pos + 1 : pos + 1 + n])
        pos += 1 + n
    out.append(Instr(name, tuple(args), at))
    if stop is None and name == "TERMINATE":
      break
  return out


def assemble(instrs: Sequence[Instr]) -> bytes:
  """Encodes instructions in the little-enhanced format (inverse of ``disassemble``)."""
  out = bytearray()
  for ins in instrs:
    if ins.name not in _OPCODE:
      raise ValueError(f"unknown ACS p-code name {ins.name!r}")
    pcode = _OPCODE[ins.name]
    out += (
        bytes([pcode]) if pcode < 240 else bytes([240 + ((pcode - 240) >> 8), (pcode - 240) & 0xFF])
    )
    layout = _PCODES[pcode][1]
    if layout == "n":
      out += bytes([len(ins.args), *ins.args])
      continue
    if len(ins.args) != len(layout):
      raise ValueError(f"{ins.name} takes {len(layout)} operands, got {ins.args}")
    for kind, a in zip(layout, ins.args):
      out += struct.pack("<i", a) if kind == "w" else bytes([a])
  return bytes(out)


def push_const(value: int) -> Instr:
  """The shortest push of an integer constant (``PUSHBYTE`` for 0..255, else ``PUSHNUMBER``)."""
  return Instr("PUSHBYTE", (value,)) if 0 <= value < 256 else Instr("PUSHNUMBER", (value,))


class Behavior(NamedTuple):
  """Parsed layout of a little-enhanced BEHAVIOR lump (offsets are bytes into the lump)."""

  scripts: dict[int, tuple[int, int, int]]  # number -> (type, address, argc); type 4 = ENTER
  sptr_offset: int  # offset of the SPTR chunk's 8-byte header
  map_vars: dict[int, int]  # MINI chunk: var index -> initial value


def parse_behavior(lump: bytes) -> Behavior:
  """Parses the header and the SPTR / MINI chunks of an ``ACS\\0``-with-``ACSe``-pretag lump."""
  if lump[:4] != b"ACS\0":
    raise ValueError(f"BEHAVIOR lump has header {lump[:4]!r}, expected b'ACS\\x00'")
  dir_ofs = struct.unpack_from("<i", lump, 4)[0]
  if lump[dir_ofs - 4 : dir_ofs] != b"ACSe":
    raise ValueError(
        f"BEHAVIOR lump is not little-enhanced ACS (pretag {lump[dir_ofs - 4:dir_ofs]!r})"
    )
  pos = struct.unpack_from("<i", lump, dir_ofs - 8)[0]
  scripts, map_vars, sptr = {}, {}, -1
  while pos + 8 <= len(lump):
    tag, size = struct.unpack_from("<4si", lump, pos)
    if pos + 8 + size > len(lump) or not tag.isalpha():
      break  # past the chunks: the pretag region, as in the engine's chunk walk
    if tag == b"SPTR":
      sptr = pos
      for k in range(size // 8):
        num, typ, argc, addr = struct.unpack_from("<hBBi", lump, pos + 8 + 8 * k)
        scripts[num] = (typ, addr, argc)
    elif tag == b"MINI":
      first = struct.unpack_from("<i", lump, pos + 8)[0]
      for k in range(size // 4 - 1):
        map_vars[first + k] = struct.unpack_from("<i", lump, pos + 12 + 4 * k)[0]
    pos += 8 + size
  if sptr < 0:
    raise ValueError("BEHAVIOR lump has no SPTR chunk")
  return Behavior(scripts, sptr, map_vars)


def enter_script(behavior: Behavior) -> tuple[int, int]:
  """(number, address) of the single ENTER script (type 4)."""
  enters = [(n, addr) for n, (typ, addr, _) in behavior.scripts.items() if typ == 4]
  if len(enters) != 1:
    raise ValueError(f"expected one ENTER script, found {len(enters)}")
  return enters[0]


# The stock ENTER script, operands included; anything else is refused.
STOCK_ENTER = (
    Instr("PUSHMAPVAR", (2,)),
    Instr("PUSHMAPVAR", (2,)),
    Instr("PUSHMAPVAR", (3,)),
    Instr("ADD"),
    Instr("PUSHBYTE", (1,)),
    Instr("SUBTRACT"),
    Instr("RANDOM"),
    Instr("ASSIGNSCRIPTVAR", (0,)),
    Instr("PUSHBYTE", (0,)),
    Instr("PUSHSCRIPTVAR", (0,)),
    Instr("GETACTORX"),
    Instr("PUSHSCRIPTVAR", (0,)),
    Instr("GETACTORY"),
    Instr("PUSH2BYTES", (0, 0)),
    Instr("SETACTORPOSITION"),
    Instr("DROP"),
    Instr("PUSH2BYTES", (0, 0)),
    Instr("PUSHNUMBER", (FIXED_ONE,)),
    Instr("RANDOM"),
    Instr("SETACTORANGLE"),
    Instr("PUSHBYTE", (0,)),
    Instr("ASSIGNGLOBALVAR", (0,)),
    Instr("CLEARINVENTORY"),
    Instr("TERMINATE"),
)


def _strip(instrs: Sequence[Instr]) -> list[Instr]:
  return [Instr(i.name, i.args) for i in instrs]


def _split_multi_pushes(instrs: Sequence[Instr]) -> list[Instr]:
  """Rewrites PUSH2BYTES..PUSH5BYTES / PUSHBYTES as single PUSHBYTEs (same semantics)."""
  out = []
  for ins in instrs:
    if ins.name in ("PUSHBYTES", "PUSH2BYTES", "PUSH3BYTES", "PUSH4BYTES", "PUSH5BYTES"):
      out.extend(Instr("PUSHBYTE", (a,)) for a in ins.args)
    else:
      out.append(Instr(ins.name, ins.args))
  return out


def _operand_span(instrs: Sequence[Instr], k: int, n_operands: int) -> int:
  """Start index of the instructions computing the top ``n_operands`` stack values before ``k``."""
  need, j = n_operands, k
  while need > 0:
    j -= 1
    if j < 0:
      raise ValueError("operands of instruction not found in the script")
    pops, pushes = _PCODES[_OPCODE[instrs[j].name]][2]
    need += pops - pushes
    if need < 0:
      raise ValueError(f"{instrs[j].name} at {j} pushes more than the operands needed")
  return j


def _replace_random_operands(instrs: list[Instr], k: int, lo: int, hi: int) -> list[Instr]:
  """Replaces the instructions producing RANDOM's (min, max) at index ``k`` with constants."""
  if instrs[k].name != "RANDOM":
    raise ValueError(f"instruction {k} is {instrs[k].name}, not RANDOM")
  j = _operand_span(instrs, k, 2)
  return instrs[:j] + [push_const(lo), push_const(hi)] + instrs[k:]


def fixed_spawn_enter(tid: int, angle_turns: tuple[float, float]) -> list[Instr]:
  """The stock ENTER script with ``Random(10, 26) -> Random(tid, tid)`` and the angle range set.

  ``angle_turns``: inclusive (lo, hi) in turns, 0 <= lo <= hi <= 1 (0 east, 0.25 north).
  """
  if not 0 <= tid < 256:
    raise ValueError(f"tid must be in 0..255, got {tid}")
  lo, hi = (round(a * FIXED_ONE) for a in angle_turns)
  if not 0 <= lo <= hi <= FIXED_ONE:
    raise ValueError(f"angle_turns must satisfy 0 <= lo <= hi <= 1, got {angle_turns}")
  instrs = _split_multi_pushes(STOCK_ENTER)
  randoms = [i for i, ins in enumerate(instrs) if ins.name == "RANDOM"]
  # Second RANDOM (angle) first, so the first one's index stays valid.
  instrs = _replace_random_operands(instrs, randoms[1], lo, hi)
  return _replace_random_operands(instrs, randoms[0], tid, tid)


def probe_loop(start_offset: int) -> list[Instr]:
  """ACS loop writing the packed player pose to global 2 (``USER2``) every tic; see ``decode_probe``.

  ``start_offset``: lump offset where the loop's first instruction will be placed (GOTO target).
  """
  return [
      Instr("PUSHBYTE", (0,)),
      Instr("GETACTORX"),
      Instr("PUSHNUMBER", (FIXED_ONE,)),
      Instr("DIVIDE"),
      Instr("PUSHNUMBER", (2048,)),
      Instr("MULTIPLY"),
      Instr("PUSHBYTE", (0,)),
      Instr("GETACTORY"),
      Instr("PUSHNUMBER", (FIXED_ONE,)),
      Instr("DIVIDE"),
      Instr("PUSHNUMBER", (1024,)),
      Instr("ADD"),
      Instr("ADD"),
      Instr("PUSHNUMBER", (512,)),
      Instr("MULTIPLY"),
      Instr("PUSHBYTE", (0,)),
      Instr("GETACTORANGLE"),
      Instr("PUSHNUMBER", (128,)),
      Instr("DIVIDE"),
      Instr("ADD"),
      Instr("ASSIGNGLOBALVAR", (2,)),
      Instr("DELAYDIRECTB", (1,)),
      Instr("GOTO", (start_offset,)),
  ]


def decode_probe(user2):
  """Inverts the probe packing. ``user2``: array of USER2 values (any shape, numeric).

  Returns (x, y, angle_turns), each the shape of ``user2``: x, y in whole map units (truncated
  toward zero), angle in [0, 1) turns with a resolution of 1/512 turn.
  """
  v = np.asarray(user2).astype(np.int64)
  angle = (v % 512) / 512.0
  xy = v // 512
  return (xy // 2048).astype(np.float64), (xy % 2048 - 1024).astype(np.float64), angle


def patch_behavior(lump: bytes, enter: Sequence[Instr] | None, probe: bool = False) -> bytes:
  """Rewrites the ENTER script of a stock BEHAVIOR lump.

  ``enter``: replacement instructions ending in TERMINATE, re-assembled in place and padded
  with NOPs to the stock length (must not be longer); None keeps the stock script.
  ``probe``: append the ``USER2`` pose loop (the lump grows; SPTR's address is moved to it).
  """
  beh = parse_behavior(lump)
  number, addr = enter_script(beh)
  stock = disassemble(lump, addr)
  if _strip(stock) != list(STOCK_ENTER):
    raise ValueError("ENTER script differs from the stock my_way_home one; refusing to patch")
  stock_len = stock[-1].offset + 1 - addr
  out = bytearray(lump)
  body = list(STOCK_ENTER) if enter is None else list(enter)
  if enter is not None:
    code = assemble(body)
    if len(code) > stock_len:
      raise ValueError(f"patched ENTER script is {len(code)} bytes, the stock one {stock_len}")
    out[addr : addr + stock_len] = code + bytes(stock_len - len(code))  # NOP padding
  if probe:
    if body[-1].name != "TERMINATE":
      raise ValueError("ENTER script must end in TERMINATE")
    head = assemble(body[:-1])
    new_addr = len(out)
    out += head + assemble(probe_loop(new_addr + len(head)))
    k = list(beh.scripts).index(number)  # SPTR entry order (dict keeps chunk order)
    struct.pack_into("<i", out, beh.sptr_offset + 8 + 8 * k + 4, new_addr)
  return bytes(out)


def derive_wad(stock: bytes, spawn: Spawn | None, probe: bool = False) -> bytes:
  """A new WAD from the stock ``my_way_home.wad`` bytes: fixed spawn (None = stock) and/or probe."""
  wad = parse_wad(stock)
  i = map_lump_index(wad, "MAP01", "BEHAVIOR")
  enter = None if spawn is None else fixed_spawn_enter(spawn.tid, spawn.angle_turns)
  if enter is None and not probe:
    return stock
  return build_wad(replace_lump(wad, i, patch_behavior(wad.lumps[i].data, enter, probe)))


# ----------------------------------------------------------------------------------------------
# Cache of derived files.


class MapFiles(NamedTuple):
  """Paths of a ready-to-use map: ``wad``, ``cfg`` and the wad's sha256 (hex)."""

  wad: Path
  cfg: Path
  sha256: str


def _write_if_changed(path: Path, data: bytes) -> None:
  """Atomically writes ``data`` to ``path`` unless it already holds exactly these bytes."""
  if path.is_file() and hashlib.sha256(path.read_bytes()).digest() == hashlib.sha256(data).digest():
    return
  fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".")
  try:
    with os.fdopen(fd, "wb") as f:
      f.write(data)
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.unlink(tmp)
    raise


def derived_cfg(stock_cfg: str, wad_name: str, gray: bool = False) -> str:
  """The stock cfg text with ``doom_scenario_path`` pointing at ``wad_name`` (same directory);
  ``gray``: the game renders in ViZDoom's 8-bit grayscale (``screen_format = GRAY8``), which
  envpool passes on as one channel per stacked frame."""
  text, n = re.subn(
      r"(?m)^(\s*doom_scenario_path\s*=\s*).*$", lambda m: m.group(1) + wad_name, stock_cfg
  )
  if n != 1:
    raise ValueError("stock cfg has no single doom_scenario_path line")
  if re.search(r"(?mi)^\s*screen_?format\s*=", text):
    raise ValueError("stock cfg already sets screen_format")
  return text + ("\nscreen_format = GRAY8\n" if gray else "")


def write_map_files(
    stem: str, wad_bytes: bytes, cache_dir: str | os.PathLike | None = None, gray: bool = False
) -> MapFiles:
  """Writes ``<stem>.wad`` and a matching ``<stem>.cfg`` (``<stem>_gray.cfg`` with ``gray``)
  to ``cache_dir`` (idempotent, atomic).

  ``cache_dir`` defaults to ``~/.cache/csd_jax/vizdoom``. The cfg is the stock one with
  ``doom_scenario_path`` pointing at the new wad (``derived_cfg``). Files already holding the same bytes (same
  sha256) are left alone, so concurrent or repeated calls are cheap and safe.
  """
  if not re.fullmatch(r"[A-Za-z0-9_.-]+", stem):
    raise ValueError(f"stem must be a plain file name, got {stem!r}")
  _, stock_cfg = stock_map_paths()
  root = Path(cache_dir if cache_dir is not None else DEFAULT_CACHE_DIR).expanduser()
  root.mkdir(parents=True, exist_ok=True)
  wad_out, cfg_out = root / f"{stem}.wad", root / (stem + ("_gray" if gray else "") + ".cfg")
  _write_if_changed(wad_out, wad_bytes)
  _write_if_changed(cfg_out, derived_cfg(stock_cfg.read_text(), wad_out.name, gray).encode())
  return MapFiles(wad_out, cfg_out, hashlib.sha256(wad_bytes).hexdigest())


def variant_files(
    variant: str,
    cache_dir: str | os.PathLike | None = None,
    probe: bool = False,
    gray: bool = False,
) -> MapFiles:
  """The wad + cfg of ``variant`` (``rl.agents.VARIANTS``), derived and cached on first use.

  ``dense`` is the stock wad, byte for byte (copied next to its cfg). ``probe``: the variant
  with the USER2 pose loop (tests and analysis only; see the module docstring). ``gray``: the
  cfg renders grayscale (``derived_cfg``).
  """
  check_variant(variant)
  stock = stock_map_paths()[0].read_bytes()
  data = derive_wad(stock, SPAWNS.get(variant), probe=probe)
  return write_map_files(
      f"my_way_home_{variant}" + ("_probe" if probe else ""), data, cache_dir, gray
  )


def spawn_files(
    spawn: Spawn,
    cache_dir: str | os.PathLike | None = None,
    probe: bool = False,
    gray: bool = False,
) -> MapFiles:
  """Like ``variant_files`` for any fixed spawn (e.g. next to the goal, to test success)."""
  data = derive_wad(stock_map_paths()[0].read_bytes(), spawn, probe=probe)
  digest = hashlib.sha256(data).hexdigest()
  return write_map_files(f"my_way_home_tid{spawn.tid}_{digest[:12]}", data, cache_dir, gray)
