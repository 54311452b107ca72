"""Rebuild what a disk holds after a power cut, from the log of the LD_PRELOAD shim (shim.c).

The shim logs every change the traced processes make to the files under one directory: each
write or truncate as BEGIN (with its data) before the real call and END (its return value)
after it, each ``fsync``/``fdatasync`` as BEGIN and END, and namespace changes (an open that
may create or truncate, unlink, rename) once they succeeded. Records carry the file's inode,
so an fsync is matched to the file it flushes whoever wrote it, as the kernel does.

**The crash model.** A power cut at log position ``cut`` (only records before it happened):

* *Durable*: every write or truncate of a file that completed (END logged) before an fsync or
  fdatasync of the same inode *began*, when that fsync completed before the cut; and every
  write through an ``O_SYNC``/``O_DSYNC`` fd. These are on the disk, whatever else happens.
* *Volatile*: the file's other operations before the cut (completed after its last durable
  fsync began, or still in flight at the cut). Which of them reach the disk is chosen by one of:
  - ``prefix``: they reach the disk in order up to a random point, and the first one lost may
    be torn: a prefix of its 512-byte sectors (split at file offsets that are multiples of
    512) is written. This is the usual model (ext4 ``data=ordered`` appends, ALICE, lazyfs).
  - ``reorder``: SQLite's documented assumptions (atomiccommit.html, "Hardware assumptions";
    psow.html): the OS may reorder writes, so any subset of them reaches the disk; one lost
    write may be torn into an arbitrary subset of its sectors; bytes outside a written range
    never change (powersafe overwrite, which SQLite's unix VFS assumes by default); and "when a
    file grows ... the new file space originally contains garbage": a gap left beyond the end
    of the file by a lost write is filled with random bytes, not zeros.
  - ``none``: every volatile operation is lost (only what was fsynced survives).
  - ``all``: every completed operation survives (what a process crash, not a power cut, leaves).
  Each file decides independently (files are flushed independently).
* *Namespace*: creating, unlinking and renaming files take effect at once, in log order (a
  simplification: a journaling file system orders them; SQLite fsyncs the directory after
  creating a journal, and Redis after renaming its files). File contents follow the inode.
* Files the shim cannot see into: SQLite's ``-shm`` (a memory map, rebuilt by SQLite when it
  opens a database after a crash) is left out of a rebuilt directory; ``ignore`` names files
  used only as markers by the tests.

The model is only as good as the log is complete: ``check_complete`` compares the full replay
(every operation applied) with the real files once the processes are dead. A write the shim did
not see (through mmap or stdio) shows up there as a mismatch.
"""

from __future__ import annotations

import bisect
import os
import random
import struct
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

HEADER = struct.Struct("<IIHHIQqQQqqII")
MAGIC = 0x31524C50
MAGIC_BYTES = struct.pack("<I", MAGIC)
TRAILER = 0x21444E45
OPEN, WRITE_BEGIN, WRITE_END, TRUNC_BEGIN, TRUNC_END, FSYNC_BEGIN, FSYNC_END, UNLINK, RENAME = range(1, 10)
F_SYNCFD, F_APPENDFD, F_DATAONLY, F_DIR = 1, 2, 4, 8
O_TRUNC = os.O_TRUNC
SECTOR = 512
PAGE = 4096
MODELS = ("prefix", "reorder", "none", "all")


class ReplayError(Exception):
    """The log does not describe the files (something changed them behind the shim's back)."""


@dataclass(frozen=True)
class Record:
    index: int
    type: int
    flags: int
    pid: int
    op: int
    ts: float  # seconds since the epoch
    dev: int
    ino: int
    offset: int
    arg: int
    path: str
    data: bytes


def read_log(path: Path) -> tuple[list[Record], int]:
    """The log's records, and how many were cut short (a process killed while logging)."""
    buf = path.read_bytes() if path.exists() else b""
    records: list[Record] = []
    torn = 0
    pos = 0
    while pos + HEADER.size <= len(buf):
        (magic, total, rtype, flags, pid, op, ts, dev, ino, offset, arg, pathlen,
         datalen) = HEADER.unpack_from(buf, pos)
        end = pos + total
        whole = (magic == MAGIC and total == HEADER.size + pathlen + datalen + 4 and end <= len(buf)
                 and struct.unpack_from("<I", buf, end - 4)[0] == TRAILER)
        if not whole:
            torn += 1
            nxt = buf.find(MAGIC_BYTES, pos + 1)
            if nxt < 0:
                break
            pos = nxt
            continue
        p = pos + HEADER.size
        records.append(Record(len(records), rtype, flags, pid, op, ts / 1e9, dev, ino, offset, arg,
                              buf[p:p + pathlen].decode(errors="surrogateescape"),
                              buf[p + pathlen:p + pathlen + datalen]))
        pos = end
    return records, torn


@dataclass
class Snapshot:
    """The files under the root before the traced processes started: taken to be on disk."""

    files: dict[str, tuple[tuple[int, int], bytes]]

    @classmethod
    def take(cls, root: Path) -> Snapshot:
        files = {}
        for p in sorted(root.rglob("*")):
            if p.is_file() and not p.is_symlink():
                st = p.stat()
                files[str(p.relative_to(root))] = ((st.st_dev, st.st_ino), p.read_bytes())
        return cls(files)


@dataclass
class Op:
    kind: str  # "w" write, "t" truncate
    begin: int  # record index of the BEGIN (of the OPEN, for O_TRUNC)
    end: int | None  # record index of the END; None: never completed
    offset: int  # write offset, or truncate length
    data: bytes = b""
    sync: bool = False  # through an O_SYNC/O_DSYNC fd: durable once completed

    def completed(self, cut: int) -> bool:
        return self.end is not None and self.end < cut

    def order(self, cut: int) -> int:
        return self.end if self.end is not None and self.end < cut else self.begin


@dataclass
class Inode:
    key: tuple[int, int]
    initial: bytes
    born: int  # record index from which it exists (-1: in the snapshot)
    ops: list[Op] = field(default_factory=list)
    fsyncs: list[tuple[int, int]] = field(default_factory=list)  # (end index, begin index), successful
    _ends: list[int] = field(default_factory=list)
    _best: list[int] = field(default_factory=list)

    def seal(self) -> None:
        self.fsyncs.sort()
        self._ends = [e for e, _ in self.fsyncs]
        best = -1
        self._best = []
        for _, b in self.fsyncs:
            best = max(best, b)
            self._best.append(best)

    def barrier(self, cut: int) -> int:
        """Operations completed before this record index are durable at ``cut``."""
        i = bisect.bisect_left(self._ends, cut)
        return self._best[i - 1] if i else -1

    def fsyncs_before(self, cut: int) -> int:
        return bisect.bisect_left(self._ends, cut)


@dataclass
class CrashInfo:
    """What one rebuild kept, per file: durable ops, volatile ops, kept of those, torn or not."""

    model: str
    cut: int
    files: dict[str, dict[str, int]] = field(default_factory=dict)

    def volatile(self) -> int:
        return sum(f["volatile"] for f in self.files.values())

    def kept(self) -> int:
        return sum(f["kept"] for f in self.files.values())

    def torn(self) -> int:
        return sum(f["torn"] for f in self.files.values())


class Trace:
    """The log of one traced run over ``snapshot``; ``crash(cut, rng, model)`` rebuilds the files."""

    def __init__(self, root: Path, snapshot: Snapshot, records: list[Record], *, ignore: Iterable[str] = (),
                 torn_records: int = 0) -> None:
        self.root = str(root.resolve())
        self.records = records
        self.torn_records = torn_records
        self.ignore = set(ignore)
        self.inodes: list[Inode] = []
        # Namespace changes: (record index, kind, path, inode or None, new path).
        self.events: list[tuple[int, str, str, Inode | None, str]] = []
        self.start: dict[str, Inode] = {}
        current: dict[tuple[int, int], Inode] = {}
        names: dict[str, Inode] = {}
        for rel, (key, data) in snapshot.files.items():
            node = Inode(key, data, -1)
            self.inodes.append(node)
            current[key] = names[rel] = self.start[rel] = node
        pending: dict[int, tuple[Inode, Op]] = {}
        fsync_begin: dict[int, tuple[Inode, int]] = {}
        self.unknown_ops = 0
        for r in records:
            key = (r.dev, r.ino)
            if r.type == OPEN:
                if r.flags & F_DIR:
                    continue
                rel = self._rel(r.path)
                node = names.get(rel)
                if node is None or node.key != key:
                    if node is not None:
                        raise ReplayError(f"{rel}: replaced behind the shim's back (record {r.index})")
                    if r.arg != 0 and not r.offset & O_TRUNC:
                        raise ReplayError(f"{rel}: {r.arg} bytes written behind the shim's back (record {r.index})")
                    node = Inode(key, b"", r.index)
                    self.inodes.append(node)
                    current[key] = names[rel] = node
                    self.events.append((r.index, "create", rel, node, ""))
                if r.offset & O_TRUNC:
                    node.ops.append(Op("t", r.index, r.index, 0))
            elif r.type in (WRITE_BEGIN, TRUNC_BEGIN):
                node = current.get(key)
                if node is None:
                    self.unknown_ops += 1
                    continue
                op = (Op("w", r.index, None, r.offset, r.data, bool(r.flags & F_SYNCFD)) if r.type == WRITE_BEGIN
                      else Op("t", r.index, None, r.offset))
                node.ops.append(op)
                pending[r.op] = (node, op)
            elif r.type in (WRITE_END, TRUNC_END):
                if r.op not in pending:
                    continue
                node, op = pending.pop(r.op)
                if r.arg < 0:
                    node.ops.remove(op)  # failed: nothing was written
                    continue
                op.end = r.index
                if op.kind == "w":
                    op.offset = r.offset
                    op.data = op.data[:r.arg]
            elif r.type == FSYNC_BEGIN:
                node = current.get(key)
                if node is not None:
                    fsync_begin[r.op] = (node, r.index)
            elif r.type == FSYNC_END:
                if r.op in fsync_begin and r.arg == 0:
                    node, begin = fsync_begin.pop(r.op)
                    node.fsyncs.append((r.index, begin))
            elif r.type == UNLINK:
                rel = self._rel(r.path)
                if rel is not None and rel in names:
                    del names[rel]
                    self.events.append((r.index, "unlink", rel, None, ""))
            elif r.type == RENAME:
                src, dst = self._rel(r.path), self._rel(r.data.decode(errors="surrogateescape"))
                node = names.pop(src, None) if src is not None else None
                if dst is not None and node is not None:
                    names[dst] = node
                self.events.append((r.index, "rename", src or "", node, dst or ""))
        for node in self.inodes:
            node.seal()

    def _rel(self, path: str) -> str:
        if path == self.root:
            return "."
        if not path.startswith(self.root + "/"):
            return path  # outside the root: kept as is, never rebuilt
        return path[len(self.root) + 1:]

    # -- questions about the log -------------------------------------------------------------
    def names_at(self, cut: int) -> dict[str, Inode]:
        names = dict(self.start)
        for index, kind, path, node, dst in self.events:
            if index >= cut:
                break
            if kind == "create" and node is not None:
                names[path] = node
            elif kind == "unlink":
                names.pop(path, None)
            elif kind == "rename":
                moved = names.pop(path, None)
                if moved is not None and dst:
                    names[dst] = moved
        return {p: n for p, n in names.items() if not p.startswith("/")}

    def writes_to(self, rel: str) -> list[Record]:
        """The BEGIN records of writes to ``rel`` (the test's marker files), in log order."""
        keys = {n.key for n in self.inodes if any(p == rel for p in self._paths_of(n))}
        return [r for r in self.records if r.type == WRITE_BEGIN and (r.dev, r.ino) in keys]

    def _paths_of(self, node: Inode) -> set[str]:
        paths = {p for p, n in self.start.items() if n is node}
        paths |= {p for _, kind, p, n, _ in self.events if n is node and kind == "create"}
        paths |= {d for _, kind, _, n, d in self.events if n is node and kind == "rename"}
        return paths

    def fsync_counts(self, cut: int | None = None) -> dict[str, int]:
        cut = len(self.records) if cut is None else cut
        return {p: n.fsyncs_before(cut) for p, n in sorted(self.names_at(cut).items()) if p not in self.ignore}

    def op_counts(self, cut: int | None = None) -> dict[str, int]:
        cut = len(self.records) if cut is None else cut
        return {p: sum(1 for op in n.ops if op.begin < cut) for p, n in sorted(self.names_at(cut).items())
                if p not in self.ignore}

    # -- rebuilding ----------------------------------------------------------------------------
    def crash(self, cut: int, rng: random.Random, model: str) -> tuple[dict[str, bytes], CrashInfo]:
        """The files as a power cut at record ``cut`` may leave them, under ``model``."""
        if model not in MODELS:
            raise ValueError(model)
        info = CrashInfo(model, cut)
        out: dict[str, bytes] = {}
        for rel, node in sorted(self.names_at(cut).items()):
            if rel in self.ignore or rel.endswith("-shm"):
                continue
            ops = sorted((op for op in node.ops if op.begin < cut), key=lambda op: op.order(cut))
            barrier = node.barrier(cut)
            durable = [op for op in ops if op.completed(cut) and (op.end < barrier or op.sync)]  # type: ignore[operator]
            volatile = [op for op in ops if not (op.completed(cut) and (op.end < barrier or op.sync))]  # type: ignore[operator]
            buf = bytearray(node.initial)
            for op in durable:
                _apply(buf, op)
            kept, torn = self._volatile(buf, volatile, cut, rng, model)
            out[rel] = bytes(buf)
            info.files[rel] = {"durable": len(durable), "volatile": len(volatile), "kept": kept, "torn": torn}
        return out, info

    @staticmethod
    def _volatile(buf: bytearray, ops: list[Op], cut: int, rng: random.Random, model: str) -> tuple[int, int]:
        if not ops or model == "none":
            return 0, 0
        if model == "all":
            done = [op for op in ops if op.completed(cut)]
            for op in done:
                _apply(buf, op)
            return len(done), 0
        if model == "prefix":
            k = rng.randint(0, len(ops))
            for op in ops[:k]:
                _apply(buf, op)
            if k < len(ops) and ops[k].kind == "w" and rng.random() < 0.5:
                pieces = _sectors(ops[k])
                if len(pieces) > 1:
                    for piece in pieces[:rng.randint(1, len(pieces) - 1)]:
                        _apply(buf, piece)
                    return k, 1
            return k, 0
        # reorder: any subset, one lost write torn into any subset of its sectors, garbage gaps
        keep = [rng.random() < 0.5 for _ in ops]
        lost = [i for i, k in enumerate(keep) if not k and ops[i].kind == "w" and len(_sectors(ops[i])) > 1]
        tear = rng.choice(lost) if lost and rng.random() < 0.5 else None
        for i, op in enumerate(ops):
            if keep[i]:
                _apply(buf, op, rng)
            elif i == tear:
                pieces = _sectors(op)
                chosen = rng.sample(pieces, rng.randint(1, len(pieces) - 1))
                for piece in sorted(chosen, key=lambda p: p.offset):
                    _apply(buf, piece, rng)
        return sum(keep), int(tear is not None)

    def full(self, cut: int | None = None, *, in_flight: bool = False) -> dict[str, bytes]:
        """Every completed operation applied (and, with ``in_flight``, the unfinished ones too)."""
        cut = len(self.records) if cut is None else cut
        out: dict[str, bytes] = {}
        for rel, node in sorted(self.names_at(cut).items()):
            buf = bytearray(node.initial)
            ops = sorted((op for op in node.ops if op.begin < cut), key=lambda op: op.order(cut))
            for op in ops:
                if op.completed(cut) or in_flight:
                    _apply(buf, op)
            out[rel] = bytes(buf)
        return out

    def check_complete(self, root: Path) -> list[str]:
        """Compare the full replay with the real files under ``root`` (every writer dead): the
        differences, which must be none (a write still in flight at the kill may or may not have
        landed, page by page). ``-shm`` files and ignored files are not compared."""
        done, flight = self.full(), self.full(in_flight=True)
        real = {rel: data for rel, (_, data) in Snapshot.take(root).files.items()}
        problems = []
        for rel in sorted(set(done) | set(real)):
            if rel.endswith("-shm") or rel in self.ignore:
                continue
            if rel not in real:
                problems.append(f"{rel}: in the replay, not on disk")
                continue
            if rel not in done:
                if real[rel]:
                    problems.append(f"{rel}: on disk ({len(real[rel])} bytes), never seen by the shim")
                continue
            a, r0, r1 = real[rel], done[rel], flight[rel]
            if a in (r0, r1):
                continue
            if not min(len(r0), len(r1)) <= len(a) <= max(len(r0), len(r1)):
                problems.append(f"{rel}: {len(a)} bytes on disk, replay {len(r0)} (in flight: {len(r1)})")
                continue
            for off in range(0, len(a), PAGE):
                page = a[off:off + PAGE]
                if page != r0[off:off + PAGE][:len(page)] and page != r1[off:off + PAGE][:len(page)]:
                    problems.append(f"{rel}: page at {off} differs from the replay")
                    break
        return problems


def _apply(buf: bytearray, op: Op, garbage: random.Random | None = None) -> None:
    if op.kind == "t":
        if op.offset < len(buf):
            del buf[op.offset:]
        else:
            buf.extend(bytes(op.offset - len(buf)))
        return
    if op.offset > len(buf):
        gap = op.offset - len(buf)
        buf.extend(garbage.randbytes(gap) if garbage is not None else bytes(gap))
    buf[op.offset:op.offset + len(op.data)] = op.data


def _sectors(op: Op) -> list[Op]:
    """A write cut at the file's 512-byte sector boundaries."""
    pieces = []
    off, end = op.offset, op.offset + len(op.data)
    while off < end:
        nxt = min(end, (off // SECTOR + 1) * SECTOR)
        pieces.append(Op("w", op.begin, op.end, off, op.data[off - op.offset:nxt - op.offset]))
        off = nxt
    return pieces


def write_files(files: dict[str, bytes], dest: Path) -> None:
    """Lay a rebuilt set of files out under ``dest`` (which must not exist yet)."""
    dest.mkdir(parents=True)
    for rel, data in files.items():
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
