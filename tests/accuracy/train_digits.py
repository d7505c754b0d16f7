#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
# File: tests/accuracy/train_digits.py
# One rank of data-parallel training of a small MLP on scikit-learn's handwritten digits, its
# gradients averaged through Chorus (ctypes on libchorus.so). Started by chorus-run (which sets
# CHORUS_UNIQUE_ID, CHORUS_RANK, CHORUS_NRANKS); run_accuracy.py drives it.
#
#   chorus-run -n 4 /usr/bin/python3 train_digits.py --lib libchorus.so --out DIR \
#       --run fp32:0 [--run fp8:0 --run fp8ef:0 ...]
#
# Each --run CONFIG:SEED is one training on one communicator (created once for all runs):
#   fp32   ncclAllReduce (fp32, ncclAvg)
#   fp8    chorusAllReduceCompressed, FP8 E4M3, block 128, fp32 scales, policy always
#   fp8ef  the same with error feedback
#   env    plain ncclAllReduce, for the transparent mode (CHORUS_COMPRESS=... set by the caller)
# A rank writes DIR/CONFIG-sSEED-rRANK.json: per-epoch curves, final test accuracy, a SHA-256
# of its final weights (the replicas must be bitwise identical) and the byte counters.
#
# Deterministic per seed: the split (fixed, independent of the seed), the initial weights
# (same on every rank), each rank's shard (by rank index) and its per-epoch shuffle (seeded by
# seed, epoch, rank) are fixed; only what the collectives return can change the trajectory.
import argparse
import ctypes
import gzip
import hashlib
import json
import os
import sys
import time

import numpy as np

DIGITS = "/usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz"
SPLIT_SEED = 20240607  # the fixed train/test split, the same for every seed and config
TEST_FRACTION = 0.2

# --- Chorus through ctypes -------------------------------------------------------------------
ncclSuccess = 0
ncclFloat32 = 7
ncclAvg = 4
chorusFp8E4M3 = 0
chorusScaleFloat32 = 0
chorusRoundNearestEven = 0
chorusCompressAlways = 0


class NcclUniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * 128)]  # NCCL_UNIQUE_ID_BYTES


class CompressConfig(ctypes.Structure):  # chorusCompressConfig_t, include/chorus/compress.h
    _fields_ = [
        ("size", ctypes.c_size_t),
        ("format", ctypes.c_int),         # chorusCompressFormat_t
        ("blockSize", ctypes.c_uint),
        ("scaleKind", ctypes.c_int),      # chorusScaleKind_t
        ("rounding", ctypes.c_int),       # chorusRounding_t
        ("errorFeedback", ctypes.c_int),
        ("seed", ctypes.c_ulonglong),
        ("policy", ctypes.c_int),         # chorusCompressPolicy_t
    ]


class ByteCounters(ctypes.Structure):  # chorusByteCounters_t
    _fields_ = [
        ("wireBytesSent", ctypes.c_ulonglong),
        ("wireBytesReceived", ctypes.c_ulonglong),
        ("dataBytesSent", ctypes.c_ulonglong),
        ("dataBytesReceived", ctypes.c_ulonglong),
    ]


class Chorus:
    def __init__(self, path):
        lib = ctypes.CDLL(path)
        self.lib = lib
        vp, sz, i = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int
        lib.ncclGetLastError.restype = ctypes.c_char_p
        lib.ncclGetLastError.argtypes = [vp]
        lib.ncclGetErrorString.restype = ctypes.c_char_p
        lib.ncclGetErrorString.argtypes = [i]
        lib.chorusLaunchInfo.argtypes = [ctypes.POINTER(NcclUniqueId), ctypes.POINTER(i),
                                         ctypes.POINTER(i)]
        lib.ncclCommInitRank.argtypes = [ctypes.POINTER(vp), i, NcclUniqueId, i]
        lib.ncclCommFinalize.argtypes = [vp]
        lib.ncclCommDestroy.argtypes = [vp]
        lib.ncclAllReduce.argtypes = [vp, vp, sz, i, i, vp, vp]
        for name in ("chorusLaunchInfo", "ncclCommInitRank", "ncclCommFinalize",
                     "ncclCommDestroy", "ncclAllReduce"):
            getattr(lib, name).restype = i
        self.have_compress = hasattr(lib, "chorusAllReduceCompressed")
        if self.have_compress:
            lib.chorusCompressorCreate.argtypes = [ctypes.POINTER(CompressConfig),
                                                   ctypes.POINTER(vp)]
            lib.chorusCompressorDestroy.argtypes = [vp]
            lib.chorusCompressorReset.argtypes = [vp]
            lib.chorusAllReduceCompressed.argtypes = [vp, vp, sz, i, i, vp, vp, vp]
            lib.chorusCommGetByteCounters.argtypes = [vp, i, ctypes.POINTER(ByteCounters)]
            lib.chorusCommResetByteCounters.argtypes = [vp]
            for name in ("chorusCompressorCreate", "chorusCompressorDestroy",
                         "chorusCompressorReset", "chorusAllReduceCompressed",
                         "chorusCommGetByteCounters", "chorusCommResetByteCounters"):
                getattr(lib, name).restype = i
        self.comm = None

    def check(self, rc, what):
        if rc != ncclSuccess:
            err = self.lib.ncclGetErrorString(rc).decode(errors="replace")
            last = self.lib.ncclGetLastError(self.comm).decode(errors="replace")
            sys.stderr.write(f"train_digits: {what} failed: {err} ({rc}): {last}\n")
            sys.stderr.flush()
            os._exit(3)  # not sys.exit: leave no half-torn communicator behind a hang

    def init(self):
        uid = NcclUniqueId()
        rank, nranks = ctypes.c_int(), ctypes.c_int()
        self.check(self.lib.chorusLaunchInfo(ctypes.byref(uid), ctypes.byref(rank),
                                             ctypes.byref(nranks)), "chorusLaunchInfo")
        comm = ctypes.c_void_p()
        self.check(self.lib.ncclCommInitRank(ctypes.byref(comm), nranks.value, uid, rank.value),
                   "ncclCommInitRank")
        self.comm = comm
        return rank.value, nranks.value

    def finish(self):
        self.check(self.lib.ncclCommFinalize(self.comm), "ncclCommFinalize")
        self.check(self.lib.ncclCommDestroy(self.comm), "ncclCommDestroy")
        self.comm = None

    def allreduce_avg(self, buf, compressor=None):
        assert buf.dtype == np.float32 and buf.flags.c_contiguous
        p = buf.ctypes.data
        if compressor is None:  # in place, the NULL stream: done on return
            self.check(self.lib.ncclAllReduce(p, p, buf.size, ncclFloat32, ncclAvg, self.comm,
                                              None), "ncclAllReduce")
        else:
            self.check(self.lib.chorusAllReduceCompressed(p, p, buf.size, ncclFloat32, ncclAvg,
                                                          compressor, self.comm, None),
                       "chorusAllReduceCompressed")

    def compressor(self, error_feedback):
        cfg = CompressConfig(ctypes.sizeof(CompressConfig), chorusFp8E4M3, 128,
                             chorusScaleFloat32, chorusRoundNearestEven, error_feedback, 0,
                             chorusCompressAlways)
        h = ctypes.c_void_p()
        self.check(self.lib.chorusCompressorCreate(ctypes.byref(cfg), ctypes.byref(h)),
                   "chorusCompressorCreate")
        return h

    def destroy_compressor(self, h):
        self.check(self.lib.chorusCompressorDestroy(h), "chorusCompressorDestroy")

    def counters(self):
        if not self.have_compress:
            return None
        c = ByteCounters()
        self.check(self.lib.chorusCommGetByteCounters(self.comm, -1, ctypes.byref(c)),
                   "chorusCommGetByteCounters")
        return {f: getattr(c, f) for f, _ in ByteCounters._fields_}

    def reset_counters(self):
        if self.have_compress:
            self.check(self.lib.chorusCommResetByteCounters(self.comm),
                       "chorusCommResetByteCounters")


# --- data ------------------------------------------------------------------------------------
def load_digits(path=DIGITS):
    with gzip.open(path, "rt") as f:
        data = np.loadtxt(f, delimiter=",", dtype=np.float32)
    x = data[:, :-1] / np.float32(16.0)  # pixels 0..16 -> [0, 1]
    y = data[:, -1].astype(np.int64)
    return x, y


def stratified_split(y, fraction=TEST_FRACTION, seed=SPLIT_SEED):
    """Test indices: round(fraction * n_c) of each class c, drawn with a fixed seed."""
    rng = np.random.default_rng(seed)
    train, test = [], []
    for c in np.unique(y):
        idx = np.flatnonzero(y == c)
        rng.shuffle(idx)
        k = int(round(fraction * idx.size))
        test.append(idx[:k])
        train.append(idx[k:])
    return np.sort(np.concatenate(train)), np.sort(np.concatenate(test))


# --- the model: 64 - H - 10, ReLU, softmax cross-entropy ---------------------------------------
class MLP:
    def __init__(self, sizes, seed):
        rng = np.random.default_rng([seed, 1])  # the same on every rank
        self.shapes = []
        for fan_in, fan_out in zip(sizes[:-1], sizes[1:]):
            self.shapes += [(fan_in, fan_out), (fan_out,)]
        self.sizes = [int(np.prod(s)) for s in self.shapes]
        self.flat = np.zeros(sum(self.sizes), dtype=np.float32)  # all parameters, one vector
        self.params = self.views(self.flat)
        for li, (fan_in, _) in enumerate(zip(sizes[:-1], sizes[1:])):  # He init, zero biases
            w = self.params[2 * li]
            w[...] = rng.normal(0.0, np.sqrt(2.0 / fan_in), size=w.shape).astype(np.float32)

    def views(self, flat):
        out, off = [], 0
        for s, n in zip(self.shapes, self.sizes):
            out.append(flat[off:off + n].reshape(s))
            off += n
        return out

    def forward(self, x):
        acts = [x]
        h = x
        nl = len(self.params) // 2
        for li in range(nl):
            z = h @ self.params[2 * li] + self.params[2 * li + 1]
            h = np.maximum(z, np.float32(0)) if li < nl - 1 else z
            acts.append(h)
        return acts  # the last one: logits

    @staticmethod
    def softmax_xent(logits, y):
        z = logits - logits.max(axis=1, keepdims=True)
        e = np.exp(z)
        p = e / e.sum(axis=1, keepdims=True)
        loss = -np.log(p[np.arange(y.size), y] + np.float32(1e-12)).mean()
        return float(loss), p

    def loss_and_grad(self, x, y, grad_flat):
        """Mean cross-entropy of the batch; its gradient written into grad_flat (fp32)."""
        acts = self.forward(x)
        loss, p = self.softmax_xent(acts[-1], y)
        d = p
        d[np.arange(y.size), y] -= np.float32(1)
        d /= np.float32(y.size)
        grads = self.views(grad_flat)
        nl = len(self.params) // 2
        for li in reversed(range(nl)):
            grads[2 * li][...] = acts[li].T @ d
            grads[2 * li + 1][...] = d.sum(axis=0)
            if li > 0:
                d = (d @ self.params[2 * li].T) * (acts[li] > 0)
        return loss

    def evaluate(self, x, y):
        logits = self.forward(x)[-1]
        loss, _ = self.softmax_xent(logits, y)
        acc = float((logits.argmax(axis=1) == y).mean())
        return loss, acc


def train(ch, rank, nranks, config, seed, a, data):
    x, y, train_idx, test_idx = data
    # Each rank's shard: every nranks-th training example, from its rank on.
    shards = [train_idx[r::nranks] for r in range(nranks)]
    shard = shards[rank]
    steps = min(s.size for s in shards) // a.batch  # the same number of steps on every rank
    model = MLP([64, a.hidden, 10], seed)
    grad = np.zeros_like(model.flat)
    vel = np.zeros_like(model.flat)
    compressor = None
    if config in ("fp8", "fp8ef"):
        if not ch.have_compress:
            sys.stderr.write("train_digits: libchorus has no chorusAllReduceCompressed\n")
            os._exit(4)
        compressor = ch.compressor(1 if config == "fp8ef" else 0)
    ch.reset_counters()
    total = a.epochs * steps
    lr0, mom, wd = np.float32(a.lr), np.float32(a.momentum), np.float32(a.weight_decay)
    xtr, ytr, xte, yte = x[train_idx], y[train_idx], x[test_idx], y[test_idx]
    tr_loss, tr_acc = model.evaluate(xtr, ytr)
    te_loss, te_acc = model.evaluate(xte, yte)
    curves = [{"epoch": 0, "step": 0, "batch_loss": None, "train_loss": tr_loss,
               "train_acc": tr_acc, "test_loss": te_loss, "test_acc": te_acc}]
    t0 = time.monotonic()
    step = 0
    for epoch in range(a.epochs):
        order = shard[np.random.default_rng([seed, epoch, rank]).permutation(shard.size)]
        batch_losses = []
        for s in range(steps):
            b = order[s * a.batch:(s + 1) * a.batch]
            batch_losses.append(model.loss_and_grad(x[b], y[b], grad))
            ch.allreduce_avg(grad, compressor)  # the mean gradient of the global batch
            # cosine learning rate, SGD with momentum and weight decay, in fp32
            lr = np.float32(0.5 * lr0 * (1.0 + np.cos(np.pi * step / total)))
            vel *= mom
            vel += grad + wd * model.flat
            model.flat -= lr * vel
            step += 1
        tr_loss, tr_acc = model.evaluate(xtr, ytr)
        te_loss, te_acc = model.evaluate(xte, yte)
        curves.append({"epoch": epoch + 1, "step": step,
                       "batch_loss": float(np.mean(batch_losses)),  # this rank's batches
                       "train_loss": tr_loss, "train_acc": tr_acc,
                       "test_loss": te_loss, "test_acc": te_acc})
    wall = time.monotonic() - t0
    counters = ch.counters()
    if compressor is not None:
        ch.destroy_compressor(compressor)
    return {"config": config, "seed": seed, "rank": rank, "nranks": nranks,
            "epochs": a.epochs, "steps_per_epoch": steps, "global_batch": a.batch * nranks,
            "params": int(model.flat.size), "train_size": int(train_idx.size),
            "test_size": int(test_idx.size), "final_test_acc": curves[-1]["test_acc"],
            "final_test_loss": curves[-1]["test_loss"],
            "weights_sha256": hashlib.sha256(model.flat.tobytes()).hexdigest(),
            "wall_s": wall, "byte_counters": counters,
            "chorus_compress_env": os.environ.get("CHORUS_COMPRESS", ""),
            "curves": curves}


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--lib", required=True, help="libchorus.so")
    p.add_argument("--out", required=True, help="directory for the per-rank JSON files")
    p.add_argument("--run", action="append", required=True, help="CONFIG:SEED (repeatable)")
    p.add_argument("--epochs", type=int, default=40)
    p.add_argument("--batch", type=int, default=16, help="per rank")
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--weight-decay", type=float, default=1e-4)
    a = p.parse_args()
    runs = []
    for r in a.run:
        config, seed = r.split(":")
        if config not in ("fp32", "fp8", "fp8ef", "env"):
            p.error(f"unknown config {config}")
        runs.append((config, int(seed)))

    x, y = load_digits()
    train_idx, test_idx = stratified_split(y)
    ch = Chorus(a.lib)
    rank, nranks = ch.init()
    os.makedirs(a.out, exist_ok=True)
    for config, seed in runs:
        res = train(ch, rank, nranks, config, seed, a, (x, y, train_idx, test_idx))
        res["hyper"] = {"batch_per_rank": a.batch, "hidden": a.hidden, "lr": a.lr,
                        "momentum": a.momentum, "weight_decay": a.weight_decay}
        path = os.path.join(a.out, f"{config}-s{seed}-r{rank}.json")
        with open(path + ".tmp", "w") as f:
            json.dump(res, f)
        os.replace(path + ".tmp", path)
        if rank == 0:
            print(f"train_digits: {config} seed {seed}: test accuracy "
                  f"{100 * res['final_test_acc']:.2f} % after {a.epochs} epochs "
                  f"({res['wall_s']:.1f} s)", flush=True)
    ch.finish()


if __name__ == "__main__":
    main()
