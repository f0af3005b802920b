#!/usr/bin/python3
"""Small PyTorch CPU training programs whose heap requests become the allocation traces
data/traces/torch_*.csv.xz (bench/record_torch_trace.sh runs them under bench/malloc_trace.c).

Each trains for ITERS iterations on random batches of variable sequence length, with fixed
seeds and one intra-op thread, so the sequence of requests is the same from run to run
(pointers and times are not). Many small and medium tensors: the per-time-step gates of the
RNNs, the per-head attention buffers of the encoder, optimizer state and temporaries.

Usage: torch_workloads.py lstm|gru|transformer [ITERS]
"""
import sys


def batches(gen, torch, iters, batch, lo, hi, vocab):
    """Token batches of random lengths in [lo, hi], each sample its own length."""
    for _ in range(iters):
        lengths = torch.randint(lo, hi + 1, (batch,), generator=gen)
        T = int(lengths.max())
        tokens = torch.randint(0, vocab, (T + 1, batch), generator=gen)
        yield tokens, lengths


def lstm(torch, iters):
    """2-layer LSTM language model on packed sequences (lengths 4..48, batch 16)."""
    from torch.nn.utils.rnn import pack_padded_sequence

    vocab, emb, hid = 2000, 64, 192
    embed = torch.nn.Embedding(vocab, emb)
    rnn = torch.nn.LSTM(emb, hid, num_layers=2)
    head = torch.nn.Linear(hid, vocab)
    params = list(embed.parameters()) + list(rnn.parameters()) + list(head.parameters())
    opt = torch.optim.Adam(params, lr=1e-3)
    gen = torch.Generator().manual_seed(2)
    for tokens, lengths in batches(gen, torch, iters, 16, 4, 48, vocab):
        opt.zero_grad()
        x = pack_padded_sequence(embed(tokens[:-1]), lengths, enforce_sorted=False)
        y = pack_padded_sequence(tokens[1:], lengths, enforce_sorted=False)
        out, _ = rnn(x)
        loss = torch.nn.functional.cross_entropy(head(out.data), y.data)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()


def gru(torch, iters):
    """2-layer bidirectional GRU tagger on packed sequences (lengths 4..48, batch 16)."""
    from torch.nn.utils.rnn import pack_padded_sequence

    vocab, emb, hid, tags = 2000, 64, 128, 24
    embed = torch.nn.Embedding(vocab, emb)
    rnn = torch.nn.GRU(emb, hid, num_layers=2, bidirectional=True)
    head = torch.nn.Linear(2 * hid, tags)
    params = list(embed.parameters()) + list(rnn.parameters()) + list(head.parameters())
    opt = torch.optim.Adam(params, lr=1e-3)
    gen = torch.Generator().manual_seed(3)
    for tokens, lengths in batches(gen, torch, iters, 16, 4, 48, vocab):
        opt.zero_grad()
        x = pack_padded_sequence(embed(tokens[:-1]), lengths, enforce_sorted=False)
        y = pack_padded_sequence(tokens[1:] % tags, lengths, enforce_sorted=False)
        out, _ = rnn(x)
        loss = torch.nn.functional.cross_entropy(head(out.data), y.data)
        loss.backward()
        opt.step()


def transformer(torch, iters):
    """2-layer transformer encoder LM (d_model 128, 4 heads), padded batches of 16 with a
    key padding mask (lengths 8..96)."""
    vocab, d, maxlen = 2000, 128, 96
    embed = torch.nn.Embedding(vocab, d)
    pos = torch.nn.Embedding(maxlen, d)
    layer = torch.nn.TransformerEncoderLayer(d, 4, dim_feedforward=256, dropout=0.1)
    enc = torch.nn.TransformerEncoder(layer, 2)
    head = torch.nn.Linear(d, vocab)
    mods = torch.nn.ModuleList([embed, pos, enc, head])
    opt = torch.optim.AdamW(mods.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(4)
    for tokens, lengths in batches(gen, torch, iters, 16, 8, maxlen, vocab):
        opt.zero_grad()
        T = tokens.shape[0] - 1
        steps = torch.arange(T)
        pad = steps[None, :] >= lengths[:, None]  # (batch, T), True = padding
        causal = torch.triu(torch.full((T, T), float("-inf")), diagonal=1)
        h = embed(tokens[:-1]) + pos(steps)[:, None, :]
        out = enc(h, mask=causal, src_key_padding_mask=pad)
        logits = head(out)
        target = tokens[1:].masked_fill(pad.t(), -100)
        loss = torch.nn.functional.cross_entropy(logits.view(-1, vocab), target.reshape(-1))
        loss.backward()
        opt.step()


def main():
    import torch

    which = sys.argv[1] if len(sys.argv) > 1 else ""
    iters = int(sys.argv[2]) if len(sys.argv) > 2 else 30
    runs = {"lstm": lstm, "gru": gru, "transformer": transformer}
    if which not in runs:
        sys.exit(__doc__)
    torch.set_num_threads(1)
    torch.manual_seed(1)
    runs[which](torch, iters)


if __name__ == "__main__":
    main()
