#!/usr/bin/python3
"""Golden outputs for the packed-sequence tests (tests/rnn/test_rnn_golden.c).

Runs PyTorch's nn.LSTM / nn.GRU / nn.RNN on pack_padded_sequence input and writes, per case,
the inputs (weights in memtrace's flat layout, padded x, hx, cx, and the loss coefficients
dy, dhy, dcy) and what PyTorch computes from them (padded y, h_n, c_n, and the gradients of
the loss sum(y * dy) + sum(h_n * dhy) + sum(c_n * dcy) for every weight, x, hx and cx).

Inputs are float32 values; PyTorch computes in float64 from them, so the golden figures are
the exact answer rounded once to float32, and the test's tolerance measures the engine alone.

Run with Debian's python3-torch (1.13):  /usr/bin/python3 tests/rnn/gen_packed_golden.py
It rewrites tests/rnn/data/packed_*.bin; the tests themselves do not need torch.

File format (little endian): the line "memtrace-packed-golden 1", a line of key=value
settings, then arrays, each a line "name count" followed by count float32 values.
"""
import os
import struct
import sys

import torch
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

MODES = {0: "rnn_tanh", 1: "rnn_relu", 2: "lstm", 3: "gru"}
INPUT, HIDDEN, LAYERS = 7, 13, 2
VARIED = [4, 1, 6, 6, 2]  # unsorted, with a length of 1 and a tie
EQUAL = [5, 5, 5]


def make(mode, bi):
    kw = dict(input_size=INPUT, hidden_size=HIDDEN, num_layers=LAYERS, bidirectional=bi)
    if mode == 2:
        return torch.nn.LSTM(**kw)
    if mode == 3:
        return torch.nn.GRU(**kw)
    return torch.nn.RNN(nonlinearity="relu" if mode == 1 else "tanh", **kw)


def flat(net, bi, attr):
    """memtrace's flat layout: per pseudo-layer (l, d): W, R, b_W, b_R (cuDNN's)."""
    parts = []
    for l in range(LAYERS):
        for d in range(2 if bi else 1):
            sfx = "_l%d%s" % (l, "_reverse" if d else "")
            for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
                p = getattr(net, name + sfx)
                parts.append((p.grad if attr == "grad" else p.data).reshape(-1))
    return torch.cat(parts)


def case(mode, bi, lengths, sorted_in, seed):
    torch.manual_seed(seed)
    D, B, T = (2 if bi else 1), len(lengths), max(lengths)
    net = make(mode, bi)
    # float32 values, computed in float64.
    with torch.no_grad():
        for p in net.parameters():
            p.copy_(p.float().double())
    net = net.double()
    x = torch.randn(T, B, INPUT).float().double()
    for b, n in enumerate(lengths):
        x[n:, b] = 0.0
    hx = torch.randn(LAYERS * D, B, HIDDEN).float().double()
    cx = torch.randn(LAYERS * D, B, HIDDEN).float().double()
    dy = torch.randn(T, B, D * HIDDEN).float().double()
    for b, n in enumerate(lengths):
        dy[n:, b] = 0.0
    dhy = torch.randn(LAYERS * D, B, HIDDEN).float().double()
    dcy = torch.randn(LAYERS * D, B, HIDDEN).float().double()
    x.requires_grad_(True)
    hx.requires_grad_(True)
    cx.requires_grad_(True)
    packed = pack_padded_sequence(x, torch.tensor(lengths), enforce_sorted=sorted_in)
    if mode == 2:
        out, (hn, cn) = net(packed, (hx, cx))
    else:
        out, hn = net(packed, hx)
        cn = torch.zeros_like(hn)
    y, _ = pad_packed_sequence(out, total_length=T)
    loss = (y * dy).sum() + (hn * dhy).sum()
    if mode == 2:
        loss = loss + (cn * dcy).sum()
    net.zero_grad()
    loss.backward()
    arrays = [
        ("lengths", torch.tensor(lengths, dtype=torch.float64)),
        ("w", flat(net, bi, "data")),
        ("x", x.detach()), ("hx", hx.detach()), ("cx", cx.detach()),
        ("dy", dy), ("dhy", dhy), ("dcy", dcy),
        ("y", y.detach()), ("hy", hn.detach()), ("cy", cn.detach()),
        ("dw", flat(net, bi, "grad")),
        ("dx", x.grad), ("dhx", hx.grad),
        ("dcx", cx.grad if mode == 2 else torch.zeros_like(cx)),
    ]
    head = "mode=%d input=%d hidden=%d layers=%d bi=%d batch=%d T=%d sorted=%d torch=%s" % (
        mode, INPUT, HIDDEN, LAYERS, int(bi), B, T, int(sorted_in), torch.__version__)
    return head, arrays


def write(path, head, arrays):
    with open(path, "wb") as f:
        f.write(b"memtrace-packed-golden 1\n")
        f.write(head.encode() + b"\n")
        for name, t in arrays:
            v = t.reshape(-1).float().tolist()
            f.write(("%s %d\n" % (name, len(v))).encode())
            f.write(struct.pack("<%df" % len(v), *v))


def main():
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
    os.makedirs(out, exist_ok=True)
    torch.set_num_threads(1)
    seed = 1
    for mode in MODES:
        for bi in (False, True):
            for kind, lengths, sorted_in in (("varied", VARIED, False), ("equal", EQUAL, True)):
                if kind == "equal" and bi and mode != 2:
                    continue  # all-equal: every mode one-way, LSTM both ways
                name = "packed_%s_%s_%s.bin" % (MODES[mode], "bi" if bi else "uni", kind)
                head, arrays = case(mode, bi, lengths, sorted_in, seed)
                write(os.path.join(out, name), head, arrays)
                seed += 1
                print(name, file=sys.stderr)


if __name__ == "__main__":
    main()
