"""Main's side of a round compiled to machine code: post a broadcast, wake the tree's roots,
spin, then sleep until the last worker's count, in one call that holds no Python objects; post
a round to some blocks (``post_blocks``), or wait for some of them (``wait_some``), the same way.

A broadcast round (one command for every worker, no payload: every ``step`` of a training
loop) is the round whose caller's work bounds a fast env's throughput. Done in Python, its
posting, spinning and sleeping took about 27,000 instructions a round; here they take a
ctypes call. An asynchronous ``send`` and ``recv`` use the per-block calls. A staged Discrete
action batch is checked and copied by the post, before anything is stored.

The code is LLVM IR compiled by llvmlite (numba's backend, always installed with shmvec,
:func:`shmvec.barrier.jit`), run on a *plan*: an int64 array this module fills once per pool
(the control lines' addresses, the wake pipes, the descriptors to watch, the blocks' targets)
and per call (the command, its argument and number, the timeout, the blocks, a staged batch).

It does what the Python waits do, in the same order, with the same barriers
(``docs/architecture.md``, "Memory ordering": [GO], [SLEEP], [DONE]) and the same probe
points. It never judges a fault: when a worker's sentinel becomes readable, the timeout passes,
a signal interrupts the sleep or a whole ``POLL_S`` goes by without a wake-up, it returns "not
done" and the general wait (``Completion``) takes the round from there, in Python, where a
KeyboardInterrupt is raised and each worker judged.

An installed probe (:mod:`shmvec.probes`) is called back at each point, so that the fault
tests pause, kill and interrupt this code, not a copy of it; an exception it raises comes out
of the call that posted or waited.
"""

from __future__ import annotations

import ctypes
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from shmvec import probes
from shmvec import protocol as P
from shmvec.barrier import jit
from shmvec.processes import WorkerProcesses
from shmvec.sync import POLL_S, SpinPolicy

__all__ = ["BroadcastRound", "DONE", "NOT_DONE", "QUIET", "Refused"]

# What the compiled functions return. Done: the round's count is complete, and its results may
# be read (the [DONE] barrier is passed).
QUIET = 0  # done, and no worker's status says that a reply or an error report follows (protocol.not_ok)
DONE = 1  # done, and some worker's does
NOT_DONE = 2  # a sentinel, the timeout, a signal or a quiet POLL_S: the general wait goes on
RAISED = 3  # a probe raised: its exception is raised by the call (_probed)
REFUSED = 4  # a staged action is outside its bounds: nothing was posted


class Refused(Exception):
    """A post refused its staged action batch (a row out of bounds): nothing was written or
    posted. The caller's own check of the batch says why (``ActionBatch.write``).
    """


Staged = tuple[int, int, int]  # a staged action batch: its rows, where it goes, its ignored rows' mask (run)
PAYLOAD_FLAG = 1 << 32  # added to a block of post_blocks whose payload follows on its pipe

# The plan's words: per pool, then per round (written by the caller before each call), then the
# broadcast round's own spin budget (SpinPolicy's rule, kept here) and its sleeps (poll calls,
# ever), then the roots.
MAIN, WORKERS, FDS, NFDS, MAX_SPIN, MIN_SPIN, YIELD_EVERY, NROOTS = range(8)
CMD, ARG, SEQ, TIMEOUT, PROBE, POSTED_AT, BUDGET, SLEEPS = range(8, 16)
# A staged action batch (check_actions, stage): its rows, their int64 staging row, the bounds
# every row not ignored must fall in ([low, high)), the ignored rows' bool mask (0: none), where
# the batch goes (0: nothing staged; the next post takes it and clears this word).
ACT_N, ACT_SRC, ACT_LOW, ACT_HIGH, ACT_MASK, ACT_DST = range(16, 22)
# Rounds of some blocks (post_blocks, wait_some): per pool, the first block's control line, a
# line's bytes, each block's target (the number its DONE reaches when done), each block's wake
# pipe; per call, the blocks (an int64 array, and how many) and how many must be done.
LINES, LINE_BYTES, TARGETS, WAKE_FDS, BLOCKS_AT, BLOCKS_N, SOME_COUNT = range(22, 29)
ROOTS_AT = 29  # then, for each root, the address of its SLEEPING word and its wake pipe's write end
WORDS = ROOTS_AT + 2 * P.ROOTS

# The probe points, by number (the compiled code's argument to the callback).
POINTS = ("main:post", "main:posted", "ring", "main:waited", "sleep:announced", "sleep:woken", "main:seen")

_IR = """
declare i32 @clock_gettime(i32, ptr)
declare i32 @poll(ptr, i64, i32)
declare i64 @write(i32, ptr, i64)
declare i64 @read(i32, ptr, i64)
declare i32 @sched_yield()

@one = internal constant i8 1
@sink = internal global [64 x i8] zeroinitializer

define internal i64 @word(ptr %plan, i64 %i) alwaysinline {
  %p = getelementptr i64, ptr %plan, i64 %i
  %v = load i64, ptr %p
  ret i64 %v
}

define internal void @set(ptr %plan, i64 %i, i64 %v) alwaysinline {
  %p = getelementptr i64, ptr %plan, i64 %i
  store i64 %v, ptr %p
  ret void
}

; A word of main's control line (shared: every access is one atomic access, never merged or hoisted).
define internal ptr @line(ptr %plan, i64 %i) alwaysinline {
  %a = call i64 @word(ptr %plan, i64 @MAIN)
  %l = inttoptr i64 %a to ptr
  %p = getelementptr i64, ptr %l, i64 %i
  ret ptr %p
}

define internal i64 @now() {
  %ts = alloca [2 x i64], align 8
  %r = call i32 @clock_gettime(i32 @CLOCK, ptr %ts)
  %sec = load i64, ptr %ts
  %np = getelementptr i64, ptr %ts, i64 1
  %ns = load i64, ptr %np
  %s = mul i64 %sec, 1000000000
  %t = add i64 %s, %ns
  ret i64 %t
}

; Calls the probe, if one is installed, at point %point: true if it raised.
define internal i1 @probe(ptr %plan, i64 %point) {
entry:
  %f = call i64 @word(ptr %plan, i64 @PROBE)
  %none = icmp eq i64 %f, 0
  br i1 %none, label %no, label %call
call:
  %fn = inttoptr i64 %f to ptr
  %r = call i32 %fn(i64 %point)
  %raised = icmp ne i32 %r, 0
  ret i1 %raised
no:
  ret i1 false
}

; The round's count complete (protocol.counted of main's DONE: the workers done).
define internal i1 @counted(ptr %plan) alwaysinline {
  %w = call ptr @line(ptr %plan, i64 @DONE)
  %v = load atomic i64, ptr %w monotonic, align 8
  %n = and i64 %v, 65535
  %workers = call i64 @word(ptr %plan, i64 @WORKERS)
  %d = icmp eq i64 %n, %workers
  ret i1 %d
}

; SOME_COUNT of the BLOCKS_N blocks at BLOCKS_AT done: each one's DONE at its target.
define internal i1 @some_done(ptr %plan) {
entry:
  %n = call i64 @word(ptr %plan, i64 @BLOCKS_N)
  %targetsa = call i64 @word(ptr %plan, i64 @TARGETS)
  %targets = inttoptr i64 %targetsa to ptr
  %count = call i64 @word(ptr %plan, i64 @SOME_COUNT)
  br label %blocks
blocks:
  %i = phi i64 [ 0, %entry ], [ %i1, %look ]
  %c = phi i64 [ 0, %entry ], [ %c1, %look ]
  %more = icmp slt i64 %i, %n
  br i1 %more, label %look, label %out
look:
  %b = call i64 @block(ptr %plan, i64 %i)
  %dp = call ptr @block_word(ptr %plan, i64 %b, i64 @DONE)
  %d = load atomic i64, ptr %dp monotonic, align 8
  %tp = getelementptr i64, ptr %targets, i64 %b
  %t = load i64, ptr %tp
  %hit = icmp eq i64 %d, %t
  %add = zext i1 %hit to i64
  %c1 = add i64 %c, %add
  %i1 = add i64 %i, 1
  br label %blocks
out:
  %enough = icmp sge i64 %c, %count
  ret i1 %enough
}

; The wait's test of done, by its kind: 0, a broadcast round's count; 1, some blocks' DONE.
define internal i1 @ready(ptr %plan, i64 %kind) alwaysinline {
entry:
  %some = icmp ne i64 %kind, 0
  br i1 %some, label %blocks, label %count
blocks:
  %b = call i1 @some_done(ptr %plan)
  ret i1 %b
count:
  %c = call i1 @counted(ptr %plan)
  ret i1 %c
}

; The wait done: the [DONE] barrier, then, in a broadcast round (kind 0), whether any worker is
; not OK (protocol.not_ok; its count's word no longer changes this round).
define internal i64 @finish(ptr %plan, i64 %kind) {
entry:
  fence seq_cst
  %forsome = icmp ne i64 %kind, 0
  br i1 %forsome, label %blocks, label %count
blocks:
  ret i64 @DONE_CODE
count:
  %w = call ptr @line(ptr %plan, i64 @DONE)
  %v = load atomic i64, ptr %w monotonic, align 8
  %bad = and i64 %v, 4294901760
  %some = icmp ne i64 %bad, 0
  %code = select i1 %some, i64 @DONE_CODE, i64 @QUIET
  ret i64 %code
}

; A staged action batch, if any: every row not ignored checked against [low, high), then every
; row copied to the round's action region (published by post's [GO] barrier). 0, or REFUSED
; with nothing written.
define internal i64 @stage(ptr %plan) {
entry:
  %dsta = call i64 @word(ptr %plan, i64 @ACT_DST)
  %staged = icmp ne i64 %dsta, 0
  br i1 %staged, label %check, label %none
check:
  %n = call i64 @word(ptr %plan, i64 @ACT_N)
  %srca = call i64 @word(ptr %plan, i64 @ACT_SRC)
  %src = inttoptr i64 %srca to ptr
  %dst = inttoptr i64 %dsta to ptr
  %low = call i64 @word(ptr %plan, i64 @ACT_LOW)
  %high = call i64 @word(ptr %plan, i64 @ACT_HIGH)
  %maska = call i64 @word(ptr %plan, i64 @ACT_MASK)
  %mask = inttoptr i64 %maska to ptr
  %masked = icmp ne i64 %maska, 0
  br label %rows
rows:
  %i = phi i64 [ 0, %check ], [ %i1, %next ]
  %more = icmp slt i64 %i, %n
  br i1 %more, label %row, label %copy
row:
  %i1 = add i64 %i, 1
  br i1 %masked, label %ignored, label %value
ignored:
  %mp = getelementptr i8, ptr %mask, i64 %i
  %m = load i8, ptr %mp
  %skip = icmp ne i8 %m, 0
  br i1 %skip, label %next, label %value
value:
  %vp = getelementptr i64, ptr %src, i64 %i
  %v = load i64, ptr %vp
  %below = icmp slt i64 %v, %low
  %above = icmp sge i64 %v, %high
  %out = or i1 %below, %above
  br i1 %out, label %refused, label %next
next:
  br label %rows
copy:
  %j = phi i64 [ 0, %rows ], [ %j1, %copied ]
  %cmore = icmp slt i64 %j, %n
  br i1 %cmore, label %copied, label %none
copied:
  %sp = getelementptr i64, ptr %src, i64 %j
  %w = load i64, ptr %sp
  %dp = getelementptr i64, ptr %dst, i64 %j
  store i64 %w, ptr %dp
  %j1 = add i64 %j, 1
  br label %copy
none:
  call void @set(ptr %plan, i64 @ACT_DST, i64 0)
  ret i64 0
refused:
  call void @set(ptr %plan, i64 @ACT_DST, i64 0)
  ret i64 @REFUSED
}

; Posting.post_broadcast: the command words and the round's tagged count, [GO], GO, [SLEEP], the roots' wake-ups.
define internal i64 @post(ptr %plan) {
start:
  %staging = call i64 @stage(ptr %plan)
  %ready = icmp eq i64 %staging, 0
  br i1 %ready, label %entry, label %refused
refused:
  ret i64 %staging
entry:
  %cmd = call i64 @word(ptr %plan, i64 @CMD)
  %arg = call i64 @word(ptr %plan, i64 @ARG)
  %seq = call i64 @word(ptr %plan, i64 @SEQ)
  %t0 = call i64 @now()
  call void @set(ptr %plan, i64 @POSTED_AT, i64 %t0)
  %wc = call ptr @line(ptr %plan, i64 @CMDWORD)
  store atomic i64 %cmd, ptr %wc monotonic, align 8
  %wa = call ptr @line(ptr %plan, i64 @ARGWORD)
  store atomic i64 %arg, ptr %wa monotonic, align 8
  %low = and i64 %seq, 2147483647
  %tag = shl i64 %low, 32
  %wd = call ptr @line(ptr %plan, i64 @DONE)
  store atomic i64 %tag, ptr %wd monotonic, align 8
  %p0 = call i1 @probe(ptr %plan, i64 0)
  br i1 %p0, label %raised, label %go
go:
  fence seq_cst
  %wg = call ptr @line(ptr %plan, i64 @GO)
  store atomic i64 %seq, ptr %wg monotonic, align 8
  %p1 = call i1 @probe(ptr %plan, i64 1)
  br i1 %p1, label %raised, label %posted
posted:
  fence seq_cst
  %nroots = call i64 @word(ptr %plan, i64 @NROOTS)
  br label %roots
roots:
  %i = phi i64 [ 0, %posted ], [ %next, %step ]
  %more = icmp slt i64 %i, %nroots
  br i1 %more, label %look, label %out
look:
  %k = mul i64 %i, 2
  %ka = add i64 %k, @ROOTS_AT
  %sa = call i64 @word(ptr %plan, i64 %ka)
  %sp = inttoptr i64 %sa to ptr
  %s = load atomic i64, ptr %sp monotonic, align 8
  %next = add i64 %i, 1
  %asleep = icmp ne i64 %s, 0
  br i1 %asleep, label %ring, label %step
ring:
  %p2 = call i1 @probe(ptr %plan, i64 2)
  br i1 %p2, label %raised, label %write
write:
  %kf = add i64 %ka, 1
  %fd64 = call i64 @word(ptr %plan, i64 %kf)
  %fd = trunc i64 %fd64 to i32
  %written = call i64 @write(i32 %fd, ptr @one, i64 1)
  br label %step
step:
  br label %roots
out:
  ret i64 0
raised:
  ret i64 @RAISED
}

; Block %b's control line, word %i (a pointer to it).
define internal ptr @block_word(ptr %plan, i64 %b, i64 %i) alwaysinline {
  %linesa = call i64 @word(ptr %plan, i64 @LINES)
  %bytes = call i64 @word(ptr %plan, i64 @LINE_BYTES)
  %at = mul i64 %b, %bytes
  %la = add i64 %linesa, %at
  %l = inttoptr i64 %la to ptr
  %p = getelementptr i64, ptr %l, i64 %i
  ret ptr %p
}

; The i-th entry of the call's BLOCKS: a block, plus PAYLOAD_FLAG when a payload follows it.
define internal i64 @entry(ptr %plan, i64 %i) alwaysinline {
  %idsa = call i64 @word(ptr %plan, i64 @BLOCKS_AT)
  %ids = inttoptr i64 %idsa to ptr
  %bp = getelementptr i64, ptr %ids, i64 %i
  %e = load i64, ptr %bp
  ret i64 %e
}

; The i-th block of the call's BLOCKS.
define internal i64 @block(ptr %plan, i64 %i) alwaysinline {
  %e = call i64 @entry(ptr %plan, i64 %i)
  %b = and i64 %e, 4294967295
  ret i64 %b
}

; Posting.post of a round to some blocks: the staged actions, each block's command words (PAYLOAD:
; whether a payload follows), [GO], each one's GO, [SLEEP], a wake-up for each that sleeps.
define internal i64 @post_blocks(ptr %plan) {
start:
  %staging = call i64 @stage(ptr %plan)
  %ready = icmp eq i64 %staging, 0
  br i1 %ready, label %entry, label %refused
refused:
  ret i64 %staging
entry:
  %cmd = call i64 @word(ptr %plan, i64 @CMD)
  %arg = call i64 @word(ptr %plan, i64 @ARG)
  %seq = call i64 @word(ptr %plan, i64 @SEQ)
  %n = call i64 @word(ptr %plan, i64 @BLOCKS_N)
  br label %words
words:
  %i = phi i64 [ 0, %entry ], [ %i1, %write ]
  %more = icmp slt i64 %i, %n
  br i1 %more, label %write, label %written
write:
  %e = call i64 @entry(ptr %plan, i64 %i)
  %b = and i64 %e, 4294967295
  %payload = lshr i64 %e, 32
  %wc = call ptr @block_word(ptr %plan, i64 %b, i64 @CMDWORD)
  store atomic i64 %cmd, ptr %wc monotonic, align 8
  %wa = call ptr @block_word(ptr %plan, i64 %b, i64 @ARGWORD)
  store atomic i64 %arg, ptr %wa monotonic, align 8
  %wp = call ptr @block_word(ptr %plan, i64 %b, i64 @PAYLOADWORD)
  store atomic i64 %payload, ptr %wp monotonic, align 8
  %i1 = add i64 %i, 1
  br label %words
written:
  %p0 = call i1 @probe(ptr %plan, i64 0)
  br i1 %p0, label %raised, label %go
go:
  fence seq_cst
  br label %gos
gos:
  %j = phi i64 [ 0, %go ], [ %j1, %stored ]
  %jmore = icmp slt i64 %j, %n
  br i1 %jmore, label %store, label %posted
store:
  %bj = call i64 @block(ptr %plan, i64 %j)
  %wg = call ptr @block_word(ptr %plan, i64 %bj, i64 @GO)
  store atomic i64 %seq, ptr %wg monotonic, align 8
  %j1 = add i64 %j, 1
  %p1 = call i1 @probe(ptr %plan, i64 1)
  br i1 %p1, label %raised, label %stored
stored:
  br label %gos
posted:
  fence seq_cst
  %fdsa = call i64 @word(ptr %plan, i64 @WAKE_FDS)
  %fds = inttoptr i64 %fdsa to ptr
  br label %sleepers
sleepers:
  %k = phi i64 [ 0, %posted ], [ %k1, %next ]
  %kmore = icmp slt i64 %k, %n
  br i1 %kmore, label %look, label %out
look:
  %bk = call i64 @block(ptr %plan, i64 %k)
  %ws = call ptr @block_word(ptr %plan, i64 %bk, i64 @SLEEPING)
  %s = load atomic i64, ptr %ws monotonic, align 8
  %k1 = add i64 %k, 1
  %asleep = icmp ne i64 %s, 0
  br i1 %asleep, label %ring, label %next
ring:
  %p2 = call i1 @probe(ptr %plan, i64 2)
  br i1 %p2, label %raised, label %wake
wake:
  %fp = getelementptr i64, ptr %fds, i64 %bk
  %fd64 = load i64, ptr %fp
  %fd = trunc i64 %fd64 to i32
  %rang = call i64 @write(i32 %fd, ptr @one, i64 1)
  br label %next
next:
  br label %sleepers
out:
  ret i64 0
raised:
  ret i64 @RAISED
}

; Completion.wait_counted (kind 0): spin for the budget, then sleep announced for the last count;
; Completion.wait for some blocks (kind 1, no deadline): the same, announced for any block.
define internal i64 @wait(ptr %plan, i64 %kind) {
entry:
  %maxspin = call i64 @word(ptr %plan, i64 @MAX_SPIN)
  %minspin = call i64 @word(ptr %plan, i64 @MIN_SPIN)
  %at_once = call i1 @ready(ptr %plan, i64 %kind)
  br i1 %at_once, label %quick, label %timed
quick:
  call void @set(ptr %plan, i64 @BUDGET, i64 %maxspin)
  %q = call i64 @finish(ptr %plan, i64 %kind)
  ret i64 %q
timed:
  %start = call i64 @now()
  %budget = call i64 @word(ptr %plan, i64 @BUDGET)
  %end = add i64 %start, %budget
  %every = call i64 @word(ptr %plan, i64 @YIELD_EVERY)
  br label %spin
spin:
  %i = phi i64 [ 0, %timed ], [ %i1, %spun ]
  %t = call i64 @now()
  %over = icmp sge i64 %t, %end
  br i1 %over, label %sleep, label %test
test:
  %d = call i1 @ready(ptr %plan, i64 %kind)
  br i1 %d, label %done, label %tally
tally:
  %i1 = add i64 %i, 1
  %yields = icmp sgt i64 %every, 0
  br i1 %yields, label %modulo, label %spun
modulo:
  %m = urem i64 %i1, %every
  %due = icmp eq i64 %m, 0
  br i1 %due, label %yield, label %spun
yield:
  %y = call i32 @sched_yield()
  br label %spun
spun:
  br label %spin
sleep:
  %p3 = call i1 @probe(ptr %plan, i64 3)
  br i1 %p3, label %raised, label %announce
announce:
  %workers = call i64 @word(ptr %plan, i64 @WORKERS)
  %last = sub i64 -1, %workers
  %any = icmp ne i64 %kind, 0
  %named = select i1 %any, i64 @ANY_BLOCK, i64 %last
  %ws = call ptr @line(ptr %plan, i64 @SLEEPING)
  store atomic i64 %named, ptr %ws monotonic, align 8
  fence seq_cst
  %p4 = call i1 @probe(ptr %plan, i64 4)
  br i1 %p4, label %cleared, label %setup
setup:
  %timeword = call i64 @word(ptr %plan, i64 @TIMEOUT)
  %timeout = select i1 %any, i64 -1, i64 %timeword
  %postedat = call i64 @word(ptr %plan, i64 @POSTED_AT)
  %deadline = add i64 %postedat, %timeout
  %fdsa = call i64 @word(ptr %plan, i64 @FDS)
  %fds = inttoptr i64 %fdsa to ptr
  %nfds = call i64 @word(ptr %plan, i64 @NFDS)
  %donefd = load i32, ptr %fds
  %rev0p = getelementptr i8, ptr %fds, i64 6
  br label %watch
watch:
  %d2 = call i1 @ready(ptr %plan, i64 %kind)
  br i1 %d2, label %woke, label %chunk
chunk:
  %forever = icmp slt i64 %timeout, 0
  br i1 %forever, label %sleeping, label %bounded
bounded:
  %tn = call i64 @now()
  %rem = sub i64 %deadline, %tn
  %gone = icmp sle i64 %rem, 0
  br i1 %gone, label %notdone, label %bounded2
bounded2:
  %remup = add i64 %rem, 999999
  %remms = sdiv i64 %remup, 1000000
  %less = icmp slt i64 %remms, @POLL_MS
  %msb = select i1 %less, i64 %remms, i64 @POLL_MS
  br label %sleeping
sleeping:
  %ms = phi i64 [ @POLL_MS, %chunk ], [ %msb, %bounded2 ]
  %ms32 = trunc i64 %ms to i32
  %slept = call i64 @word(ptr %plan, i64 @SLEEPS)
  %slept1 = add i64 %slept, 1
  call void @set(ptr %plan, i64 @SLEEPS, i64 %slept1)
  %r = call i32 @poll(ptr %fds, i64 %nfds, i32 %ms32)
  %p5 = call i1 @probe(ptr %plan, i64 5)
  br i1 %p5, label %cleared, label %judge
judge:
  %quiet = icmp sle i32 %r, 0
  br i1 %quiet, label %notdone, label %rang
rang:
  %rev0 = load i16, ptr %rev0p
  %isdone = icmp ne i16 %rev0, 0
  br i1 %isdone, label %drain, label %sentinels
drain:
  %got = call i64 @read(i32 %donefd, ptr @sink, i64 64)
  %full = icmp eq i64 %got, 64
  br i1 %full, label %drain, label %sentinels
sentinels:
  %j = phi i64 [ 1, %rang ], [ 1, %drain ], [ %j1, %alive ]
  %jmore = icmp slt i64 %j, %nfds
  br i1 %jmore, label %sentinel, label %watch
sentinel:
  %off = mul i64 %j, 8
  %off6 = add i64 %off, 6
  %revp = getelementptr i8, ptr %fds, i64 %off6
  %rev = load i16, ptr %revp
  %j1 = add i64 %j, 1
  %dead = icmp ne i16 %rev, 0
  br i1 %dead, label %notdone, label %alive
alive:
  br label %sentinels
woke:
  store atomic i64 0, ptr %ws monotonic, align 8
  %p6 = call i1 @probe(ptr %plan, i64 6)
  br i1 %p6, label %raised, label %done
done:
  %tend = call i64 @now()
  %waited = sub i64 %tend, %start
  %short = icmp sle i64 %waited, %maxspin
  %nextbudget = select i1 %short, i64 %maxspin, i64 %minspin
  call void @set(ptr %plan, i64 @BUDGET, i64 %nextbudget)
  %f = call i64 @finish(ptr %plan, i64 %kind)
  ret i64 %f
notdone:
  store atomic i64 0, ptr %ws monotonic, align 8
  call void @set(ptr %plan, i64 @BUDGET, i64 %minspin)
  ret i64 @NOT_DONE
cleared:
  store atomic i64 0, ptr %ws monotonic, align 8
  br label %raised
raised:
  ret i64 @RAISED
}

define i64 @shmvec_post(i64 %plan) {
  %p = inttoptr i64 %plan to ptr
  %r = call i64 @post(ptr %p)
  ret i64 %r
}

define i64 @shmvec_wait(i64 %plan) {
  %p = inttoptr i64 %plan to ptr
  %r = call i64 @wait(ptr %p, i64 0)
  ret i64 %r
}

define i64 @shmvec_post_blocks(i64 %plan) {
  %p = inttoptr i64 %plan to ptr
  %r = call i64 @post_blocks(ptr %p)
  ret i64 %r
}

define i64 @shmvec_wait_some(i64 %plan) {
  %p = inttoptr i64 %plan to ptr
  %r = call i64 @wait(ptr %p, i64 1)
  ret i64 %r
}

define i64 @shmvec_round(i64 %plan) {
entry:
  %p = inttoptr i64 %plan to ptr
  %r = call i64 @post(ptr %p)
  %ok = icmp eq i64 %r, 0
  br i1 %ok, label %wait, label %out
wait:
  %w = call i64 @wait(ptr %p, i64 0)
  ret i64 %w
out:
  ret i64 %r
}
"""

_NAMES = {
    "MAIN": MAIN,
    "WORKERS": WORKERS,
    "FDS": FDS,
    "NFDS": NFDS,
    "MAX_SPIN": MAX_SPIN,
    "MIN_SPIN": MIN_SPIN,
    "YIELD_EVERY": YIELD_EVERY,
    "NROOTS": NROOTS,
    "CMD": CMD,
    "ARG": ARG,
    "SEQ": SEQ,
    "TIMEOUT": TIMEOUT,
    "PROBE": PROBE,
    "POSTED_AT": POSTED_AT,
    "BUDGET": BUDGET,
    "SLEEPS": SLEEPS,
    "ROOTS_AT": ROOTS_AT,
    "CMDWORD": P.CMD,
    "ARGWORD": P.ARG,
    "GO": P.GO,
    "DONE": P.DONE,
    "SLEEPING": P.SLEEPING,
    "DONE_CODE": DONE,
    "QUIET": QUIET,
    "NOT_DONE": NOT_DONE,
    "RAISED": RAISED,
    "REFUSED": REFUSED,
    "ACT_N": ACT_N,
    "ACT_SRC": ACT_SRC,
    "ACT_LOW": ACT_LOW,
    "ACT_HIGH": ACT_HIGH,
    "ACT_MASK": ACT_MASK,
    "ACT_DST": ACT_DST,
    "LINES": LINES,
    "LINE_BYTES": LINE_BYTES,
    "TARGETS": TARGETS,
    "WAKE_FDS": WAKE_FDS,
    "BLOCKS_AT": BLOCKS_AT,
    "BLOCKS_N": BLOCKS_N,
    "PAYLOADWORD": P.PAYLOAD,
    "SOME_COUNT": SOME_COUNT,
    "ANY_BLOCK": P.ANY_BLOCK,
    "POLL_MS": round(POLL_S * 1000),
    "CLOCK": time.CLOCK_MONOTONIC,
}


def ir() -> str:
    """The round's LLVM IR, its constants filled in (longest names first: none is cut short)."""
    text = _IR
    for name in sorted(_NAMES, key=len, reverse=True):
        text = text.replace("@" + name, str(_NAMES[name]))
    return text


_EXPORTED = ("post", "wait", "round", "wait_some", "post_blocks")
_functions: dict[str, Any] = {}
_compiling = threading.Lock()
# What a probe raised, per thread, for the call that ran it to raise.
_local = threading.local()


def _call_probe(point: int) -> int:
    """The compiled code's way to a probe: 1 if it raised (kept for :func:`_probed`), else 0."""
    try:
        probe = probes.probe
        if probe:
            probe(POINTS[point])
    except BaseException as exc:  # a Ctrl-C or a test's exception: raised by the call that posted or waited
        _local.raised = exc
        return 1
    return 0


def _keep(unraisable: Any) -> None:
    """``sys.unraisablehook`` during a probed call. A Ctrl-C that arrived while the compiled code
    ran without the GIL is raised as the callback's frame begins, before its ``try``; ctypes can
    only report it as unraisable. It is kept, to be raised by the call.
    """
    if getattr(_local, "raised", None) is None:
        _local.raised = unraisable.exc_value


def _probed(fn: Callable[[Any], int], address: Any) -> int:
    """``fn(address)`` with a probe installed: whatever the probe raised, or a Ctrl-C that
    landed as it was called back, is raised here, once the compiled code has returned.
    """
    _local.raised = None
    previous, sys.unraisablehook = sys.unraisablehook, _keep
    try:
        code = fn(address)
    finally:
        sys.unraisablehook = previous
    raised, _local.raised = _local.raised, None
    if raised is not None:
        raise raised
    return code


def _compiled() -> dict[str, Any]:
    """The round's functions, compiled once per process (about 0.1 s; forked workers, which never
    post a round, inherit them unused). Two threads building the first pools at once compile once.
    """
    with _compiling:
        if not _functions:
            engine = jit(ir())
            kind = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_int64)  # releases the GIL while it runs
            functions: dict[str, Any] = {
                name: kind(engine.get_function_address("shmvec_" + name)) for name in _EXPORTED
            }
            callback = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int64)(_call_probe)
            functions["probe"] = callback  # (kept alive: the compiled code holds its address)
            functions["probe_address"] = ctypes.cast(callback, ctypes.c_void_p).value
            _functions.update(functions)
    return _functions


class BroadcastRound:
    """The compiled broadcast round of one pool.

    Parameters
    ----------
    ctrl : numpy.ndarray
        The pool's control lines, int64 ``[blocks + 1, 8]`` in the shared segment (main's last);
        held, so that the mapping outlives every call.
    workers : WorkerProcesses
        Their wake pipes (the roots') and ``watched``, the done pipe and every sentinel.
    num_workers : int
    policy : SpinPolicy
        Main's: its budgets seed this round's own.
    """

    def __init__(self, ctrl: np.ndarray, workers: WorkerProcesses, num_workers: int, policy: SpinPolicy) -> None:
        functions = _compiled()
        self._post, self._wait, self._round = functions["post"], functions["wait"], functions["round"]
        self._wait_some, self._post_blocks = functions["wait_some"], functions["post_blocks"]
        self._probe_address = functions["probe_address"]
        self._ctrl, self._watched = ctrl, workers.watched  # (held: the plan points into both)
        words = self._words = np.zeros(WORDS, dtype=np.int64)
        plan = self.plan = words.data  # (a memoryview: an item costs a third of a numpy scalar's)
        plan[MAIN] = ctrl[-1].ctypes.data
        plan[WORKERS] = num_workers
        plan[FDS], plan[NFDS] = workers.watched.ctypes.data, len(workers.watched)
        plan[MAX_SPIN] = plan[BUDGET] = round(policy.max_spin * 1e9)
        plan[MIN_SPIN] = round(policy.min_spin * 1e9)
        plan[YIELD_EVERY] = policy.yield_every
        roots = P.relay_children(None, num_workers)
        plan[NROOTS] = len(roots)
        for i, block in enumerate(roots):
            plan[ROOTS_AT + 2 * i] = ctrl[block].ctypes.data + P.SLEEPING * ctrl.itemsize
            plan[ROOTS_AT + 2 * i + 1] = workers.wake_fds[block]
        plan[TIMEOUT] = -1
        self._timeout: float | None = None
        # Each block's target, the pool's record (WorkerPool._target is this memoryview), the
        # blocks of a call, and each worker's wake pipe (made once per block: a replacement
        # reads the same one).
        blocks = len(ctrl) - 1
        self._targets, self._blocks = np.zeros(blocks, dtype=np.int64), np.zeros(blocks, dtype=np.int64)
        self.targets, self._blocks_at = self._targets.data, self._blocks.data
        self._wake_fds = np.array(workers.wake_fds + [-1] * (blocks - num_workers), dtype=np.int64)
        plan[LINES], plan[LINE_BYTES] = ctrl.ctypes.data, ctrl.strides[0]
        plan[TARGETS], plan[BLOCKS_AT] = self._targets.ctypes.data, self._blocks.ctypes.data
        plan[WAKE_FDS] = self._wake_fds.ctypes.data
        self._address = ctypes.c_int64(words.ctypes.data)

    def check_actions(self, staging: np.ndarray, low: int, high: int) -> None:
        """Let a post take a staged action batch (its ``actions``) from ``staging``, int64,
        whose rows must each fall in ``[low, high)``.
        """
        self._staging = staging  # (held: the plan points into it)
        plan = self.plan
        plan[ACT_SRC], plan[ACT_LOW], plan[ACT_HIGH] = staging.ctypes.data, low, high

    def run(self, cmd: int, arg: int, seq: int, timeout: float | None, actions: Staged | None = None) -> int:
        """Post round ``seq`` (``cmd`` with ``arg``) and wait for it: :data:`QUIET` or
        :data:`DONE` once every worker has counted itself done; :data:`NOT_DONE` when the
        general wait must take it (a worker's sentinel, ``timeout`` since the post, a signal,
        or ``POLL_S`` with no wake-up).

        ``actions``: ``(n, dst, ignored)``, a staged batch: the first ``n`` rows of the staging
        row (:meth:`check_actions`) are checked, but where the bool mask at address ``ignored``
        is set (0: none), then copied to address ``dst``, before anything is posted;
        :data:`REFUSED` when a row is out of bounds, with nothing written or posted.
        """
        plan = self.plan
        plan[CMD], plan[ARG], plan[SEQ] = cmd, arg, seq
        if actions is None:  # (every post writes these: no staged batch outlives its call)
            plan[ACT_DST] = 0
        else:
            plan[ACT_N], plan[ACT_DST], plan[ACT_MASK] = actions
        if timeout != self._timeout:
            plan[TIMEOUT] = _nanoseconds(timeout)
            self._timeout = timeout
        if probes.probe:
            plan[PROBE] = self._probe_address
            return _probed(self._round, self._address)
        plan[PROBE] = 0
        return self._round(self._address)

    def set_targets(self, count: int, seq: int) -> None:
        """The first ``count`` blocks' target: ``seq`` (a round posted to every worker)."""
        self._targets[:count] = seq

    def wait_some(self, block_ids: list[int], count: int) -> bool:
        """Wait, with no deadline, until ``count`` worker blocks of ``block_ids`` are done (each
        one's DONE at its target), as :meth:`wait` waits for a broadcast's count, but announced
        for any block: whether they are. Not done: a sentinel (of any worker), a signal or a
        quiet ``POLL_S``; the general wait goes on from there.
        """
        plan, blocks = self.plan, self._blocks_at
        for i, block in enumerate(block_ids):
            blocks[i] = block
        plan[BLOCKS_N], plan[SOME_COUNT] = len(block_ids), count
        if probes.probe:
            plan[PROBE] = self._probe_address
            return _probed(self._wait_some, self._address) < NOT_DONE
        plan[PROBE] = 0
        return self._wait_some(self._address) < NOT_DONE

    def posted_at(self) -> float:
        """When the last round was posted, on ``time.perf_counter``'s clock (the plan's is
        ``CLOCK_MONOTONIC``: its age is carried over, so the two clocks need not agree).
        """
        age = time.clock_gettime_ns(time.CLOCK_MONOTONIC) - self.plan[POSTED_AT]
        return time.perf_counter() - age * 1e-9

    @property
    def sleeps(self) -> int:
        """The times this round's wait has blocked in ``poll``, since the pool started."""
        return int(self.plan[SLEEPS])

    def post(self, cmd: int, arg: int, seq: int, actions: Staged | None = None) -> int:
        """Post round ``seq``, not waiting for it: 0, or :data:`REFUSED` (``actions``: see :meth:`run`)."""
        plan = self.plan
        plan[CMD], plan[ARG], plan[SEQ] = cmd, arg, seq
        if actions is None:  # (every post writes these: no staged batch outlives its call)
            plan[ACT_DST] = 0
        else:
            plan[ACT_N], plan[ACT_DST], plan[ACT_MASK] = actions
        if probes.probe:
            plan[PROBE] = self._probe_address
            return _probed(self._post, self._address)
        plan[PROBE] = 0
        return self._post(self._address)

    def post_blocks(self, cmd: int, arg: int, seq: int, block_ids: list[int], actions: Staged | None = None) -> int:
        """Post round ``seq`` to the worker blocks ``block_ids``, on each one's line, a block
        plus :data:`PAYLOAD_FLAG` where a payload follows on its pipe (``Posting.post``'s
        words, barriers and wake-ups): 0, or :data:`REFUSED` (``actions``: see :meth:`run`).
        """
        plan, blocks = self.plan, self._blocks_at
        for i, block in enumerate(block_ids):  # (a few items: cheaper than numpy's conversion of a list)
            blocks[i] = block
        plan[CMD], plan[ARG], plan[SEQ], plan[BLOCKS_N] = cmd, arg, seq, len(block_ids)
        if actions is None:  # (every post writes these: no staged batch outlives its call)
            plan[ACT_DST] = 0
        else:
            plan[ACT_N], plan[ACT_DST], plan[ACT_MASK] = actions
        if probes.probe:
            plan[PROBE] = self._probe_address
            return _probed(self._post_blocks, self._address)
        plan[PROBE] = 0
        return self._post_blocks(self._address)

    def wait(self, timeout: float | None) -> bool:
        """Wait for the round posted last, as :meth:`run` does: whether it is done."""
        plan = self.plan
        if timeout != self._timeout:
            plan[TIMEOUT] = _nanoseconds(timeout)
            self._timeout = timeout
        if probes.probe:
            plan[PROBE] = self._probe_address
            return _probed(self._wait, self._address) < NOT_DONE
        plan[PROBE] = 0
        return self._wait(self._address) < NOT_DONE


def _nanoseconds(timeout: float | None) -> int:
    """The plan's ``TIMEOUT``: ``timeout`` in nanoseconds, at least 0 (-1: none, also for an
    infinite or NaN timeout, or one past 2**60 ns, where the deadline's sum would overflow).
    """
    if timeout is None or not timeout < _LONGEST_S:
        return -1
    return max(0, int(timeout * 1e9))


_LONGEST_S = (1 << 60) / 1e9
