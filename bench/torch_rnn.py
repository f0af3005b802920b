#!/usr/bin/python3
"""The PyTorch side of bench_rnn: one LSTM training step (forward + backward) on a packed
batch, as the C benchmark runs it, timed. Prints one line: "torch <version> tokens/s <x>
step_ms <y> threads <n>", or "torch unavailable: <why>" (exit status 0 either way).

Usage: torch_rnn.py THREADS ITERS INPUT HIDDEN LAYERS LEN1,LEN2,...
"""
import sys
import time


def main():
    try:
        import torch
        from torch.nn.utils.rnn import pack_padded_sequence
    except Exception as e:  # the benchmark then reports the row as not measured
        print("torch unavailable: %s" % e)
        return
    threads, iters, inp, hid, layers = (int(v) for v in sys.argv[1:6])
    lengths = [int(v) for v in sys.argv[6].split(",")]
    torch.set_num_threads(threads)
    torch.manual_seed(1)
    T, B = max(lengths), len(lengths)
    net = torch.nn.LSTM(inp, hid, num_layers=layers)
    x = torch.randn(T, B, inp)
    lens = torch.tensor(lengths)
    dy = None
    best = float("inf")
    for it in range(iters + 1):
        t0 = time.perf_counter()
        packed = pack_padded_sequence(x, lens, enforce_sorted=False)
        out, _ = net(packed)
        if dy is None:
            dy = torch.randn_like(out.data)
        out.data.backward(dy)
        dt = time.perf_counter() - t0
        if it > 0:  # the first step warms the caches
            best = min(best, dt)
        net.zero_grad()
    print("torch %s tokens/s %.1f step_ms %.2f threads %d" % (
        torch.__version__, sum(lengths) / best, best * 1e3, torch.get_num_threads()))


if __name__ == "__main__":
    main()
