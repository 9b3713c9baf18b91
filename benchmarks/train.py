"""Benchmark `hir train`'s model against PyG's HGTConv on one snapshot (default completejourney).

    python benchmarks/train.py --run-dir outputs/completejourney/default   # needs graph/ + content/
    python benchmarks/train.py --run-dir ... --steps 30 --threads 2

Fair setup: both models get the *same seeds per batch and the same sampled neighbourhoods* (the
engagement-view contexts of hir's sampler; for HGT each context becomes typed edges token -> seed,
edge type = (token type, relation x hop, seed type)) and the *same input features* (hir's token
encoder: hashed ids + type + content projection). What differs is the layer stack: 2 bias-aware
transformer blocks + the M primitive tokens vs 2 ``torch_geometric.nn.HGTConv`` layers of the same
width and heads. Both train with the same loss (in-batch contrastive on the batch's deep-funnel
pairs + the tokenizer's collapse guard) and AdamW; parameter counts are reported (the hashed id
table dominates both). Reported per model: seed contexts per second of a training step (forward +
backward + optimizer) and the peak RSS of its own subprocess; for hir also the full
self-distillation step (two views + EMA teacher + four loss parts) and the sampler alone.

Results: benchmarks/results/train.json (the ratio is hir / HGT contexts per second).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

ROOT = Path(__file__).resolve().parents[1]
MODES = ("sampler", "hir_full", "hir_encoder", "hgt")


def _defaults() -> dict[str, Any]:
    from omegaconf import OmegaConf

    return OmegaConf.to_container(OmegaConf.load(ROOT / "conf" / "model" / "hir.yaml"), resolve=True)


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _batches(run_dir: Path, m: dict[str, Any], n: int):
    from hir.train.context import ContextSampler
    from hir.train.datamodule import TrainBatches
    from hir.train.graph import load_graph

    store = load_graph(run_dir / "graph", run_dir / "content", ("train",), **m["graph"])
    sampler = ContextSampler(store, **m["context"])
    ds = TrainBatches(store, sampler, m["data"]["batch_size"], m["data"]["pairs"], m["data"]["seeds_per_epoch"], seed=0)
    t0 = time.perf_counter()
    batches = [ds[(0, i % len(ds))] for i in range(n)]
    return store, batches, time.perf_counter() - t0


def _net_kwargs(store, m: dict[str, Any]) -> dict[str, Any]:
    keys = ("dim", "depth", "heads", "mlp_ratio", "dropout", "id_buckets", "id_dropout", "attention_backend", "bias",
            "hierarchy", "primitive_tokens", "prior_max")
    return {**store.spec, **{k: m[k] for k in keys}}


class HGTNet:
    """hir's token encoder for node features, 2 HGTConv layers over the context star graphs, the
    same output head/normalisation and tokenizer (for the collapse-guard loss)."""

    def __init__(self, store, m: dict[str, Any], edge_types: list[tuple[str, str, str]]) -> None:
        import torch
        from torch_geometric.nn import HGTConv

        from hir.nn import HirNet

        base = HirNet(**_net_kwargs(store, m))
        self.encoder, self.head, self.out_norm, self.tokenizer = base.encoder, base.head, base.out_norm, base.tokenizer
        self.types = list(store.types)
        self.convs = torch.nn.ModuleList(
            HGTConv(m["dim"], m["dim"], (self.types, edge_types), heads=m["heads"]) for _ in range(m["depth"])
        )
        self.modules = torch.nn.ModuleList([self.encoder, self.head, self.out_norm, self.tokenizer, self.convs])

    def parameters(self):
        return self.modules.parameters()

    def prepare(self, batch: dict[str, Any], store) -> dict[str, Any]:
        """Batch -> the typed star graphs (data preparation, outside the timed step, like hir's
        sampler): distinct nodes, their type-local positions, edge_index per edge type."""
        import torch

        from hir.nn.buckets import RELATIONS

        eng = batch["eng"]
        node, mask, rel, hop = eng["node"], eng["mask"], eng["relation"], eng["hop"]
        uniq, inv = torch.unique(node[mask], return_inverse=True)
        ntype = torch.from_numpy(store.node_type)[uniq].long()
        local = torch.full(node.shape, -1, dtype=torch.long)
        local[mask] = inv
        pos = torch.empty_like(uniq)
        for ti in range(len(self.types)):
            sel = ntype == ti
            pos[sel] = torch.arange(int(sel.sum()))
        src = local[:, 1:][mask[:, 1:]]
        dst = local[:, :1].expand_as(local[:, 1:])[mask[:, 1:]]
        ename = [f"{RELATIONS[r]}{h}" for r, h in zip(rel[:, 1:][mask[:, 1:]].tolist(), hop[:, 1:][mask[:, 1:]].tolist())]
        edges: dict[tuple[str, str, str], list[list[int]]] = {}
        for s_, d_, r in zip(src.tolist(), dst.tolist(), ename):
            key = (self.types[int(ntype[s_])], r, self.types[int(ntype[d_])])
            e = edges.setdefault(key, [[], []])
            e[0].append(int(pos[s_]))
            e[1].append(int(pos[d_]))
        return {"uniq": uniq, "ntype": ntype, "pos": pos, "seed_rows": local[:, 0],
                "edge_index": {k: torch.tensor(v, dtype=torch.long) for k, v in edges.items()},
                "row": torch.searchsorted(batch["content_nodes"], uniq[:, None]),
                "exposure": torch.from_numpy(store.exposure)[uniq][:, None]}

    def __call__(self, batch: dict[str, Any], g: dict[str, Any]) -> Any:
        import torch
        import torch.nn.functional as F

        uniq, ntype, pos = g["uniq"], g["ntype"], g["pos"]
        u = uniq[:, None]
        z0 = torch.zeros_like(u)
        # node features: the token encoder on each distinct node as its own seed (no context features)
        feats = self.encoder({
            "node": u, "row": g["row"], "content": batch["content"], "type": ntype[:, None], "relation": z0,
            "hop": z0, "stage": z0, "count": z0.float(), "age": z0.float(), "exposure": g["exposure"],
        }, use_ids=True)[:, 0]  # (U, C)
        x_dict = {t: feats[ntype == ti] for ti, t in enumerate(self.types) if bool((ntype == ti).any())}
        for conv in self.convs:
            out = conv(x_dict, g["edge_index"])
            x_dict = {t: (out[t] if out.get(t) is not None else x) for t, x in x_dict.items()}
        seed_types = ntype[g["seed_rows"]]
        h = torch.zeros(len(seed_types), feats.shape[1])
        for ti, t in enumerate(self.types):
            sel = seed_types == ti
            if sel.any():
                h[sel] = x_dict[t][pos[g["seed_rows"][sel]]]
        return F.normalize(self.out_norm(self.head(h), seed_types * 2 + 1), dim=-1)


def _edge_types(batches, store) -> list[tuple[str, str, str]]:
    from hir.nn.buckets import RELATIONS

    seen = set()
    for b in batches:
        eng = b["eng"]
        m = eng["mask"][:, 1:]
        src_t = eng["type"][:, 1:][m]
        dst_t = eng["type"][:, :1].expand_as(eng["type"][:, 1:])[m]
        rel = eng["relation"][:, 1:][m]
        hop = eng["hop"][:, 1:][m]
        for s, d, r, h in set(zip(src_t.tolist(), dst_t.tolist(), rel.tolist(), hop.tolist())):
            seen.add((store.types[s], f"{RELATIONS[r]}{h}", store.types[d]))
    return sorted(seen)


def _simple_loss(z, batch, tokenizer, semantic=None) -> Any:
    """In-batch contrastive on the pairs + the tokenizer's collapse guard: the same for both models.
    ``semantic``: the tokenizer's input when it differs from ``z`` (hir's embedding without its
    prior coordinate; the HGT head outputs the semantic part only)."""
    import torch

    from hir.nn.losses import BalanceLoss, ContrastiveLoss

    p = int(batch["n_pairs"])
    cand = batch["cand_index"]
    loss = ContrastiveLoss(0.1)(z[:p], z[cand], batch["log_q"], batch["seeds"][cand])
    sem = z if semantic is None else semantic
    return loss + BalanceLoss(tokenizer.levels)([tokenizer.scores(sem)]) + 0 * torch.zeros(())


def worker(mode: str, run_dir: Path, steps: int, warmup: int, threads: int) -> dict[str, Any]:
    import numpy as np
    import torch

    from hir.nn import HirNet
    from hir.train.module import HirModule

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    m = _defaults()
    store, batches, t_sample = _batches(run_dir, m, steps + warmup)
    seeds_per_batch = int(batches[0]["seeds"].shape[0])
    out: dict[str, Any] = {"mode": mode, "seed_contexts_per_batch": seeds_per_batch, "steps": steps}
    if mode == "sampler":
        out["contexts_per_s"] = seeds_per_batch * len(batches) / t_sample
        out["peak_rss_mib"] = _rss_mib()
        return out
    rss_before = _rss_mib()
    if mode.startswith("hir"):
        kw = _net_kwargs(store, m)
        net = HirNet(**kw)
        module = HirModule(net, kw, m["objective"], m["optim"])
        params = [p for p in module.parameters() if p.requires_grad]
        out["parameters"] = sum(p.numel() for p in net.parameters())
        out["parameters_without_id_table"] = out["parameters"] - net.encoder.ids.weight.numel()

        def step(b):
            if mode == "hir_full":
                loss = sum(module.loss_parts(b).values())
            else:
                z = net({**b["eng"], "content": b["content"]}, use_ids=True)
                loss = _simple_loss(z, b, net.tokenizer, net.semantic(z))
            opt.zero_grad()
            loss.backward()
            opt.step()
            if mode == "hir_full":
                module.on_train_batch_end(None, b, 0)
    else:
        for b in batches:
            nodes = np.concatenate([b["eng"]["node"][b["eng"]["mask"]].numpy(), b["kno"]["node"][b["kno"]["mask"]].numpy()])
            b["content_nodes"] = torch.from_numpy(np.unique(nodes))
        hgt = HGTNet(store, m, _edge_types(batches, store))
        t0 = time.perf_counter()
        graphs = [hgt.prepare(b, store) for b in batches]
        out["graph_prep_s_per_batch"] = (time.perf_counter() - t0) / len(batches)
        for b, g in zip(batches, graphs):
            b["graph"] = g
        params = [p for p in hgt.parameters() if p.requires_grad]
        out["parameters"] = sum(p.numel() for p in hgt.parameters())
        out["parameters_without_id_table"] = out["parameters"] - hgt.encoder.ids.weight.numel()
        out["edge_types"] = len(hgt.convs[0].edge_types)

        def step(b):
            z = hgt(b, b["graph"])
            loss = _simple_loss(z, b, hgt.tokenizer)
            opt.zero_grad()
            loss.backward()
            opt.step()

    opt = torch.optim.AdamW(params, lr=1e-3)
    for b in batches[:warmup]:
        step(b)
    t0, c0 = time.perf_counter(), time.process_time()
    for b in batches[warmup:]:
        step(b)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    out.update({
        "contexts_per_s": seeds_per_batch * steps / wall, "seconds_per_step": wall / steps,
        "cpu_seconds_per_step": cpu / steps, "peak_rss_mib": _rss_mib(), "rss_before_model_mib": rss_before,
    })
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run-dir", type=Path, default=ROOT / "outputs" / "completejourney" / "default")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "train.json")
    ap.add_argument("--worker", choices=MODES, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print("RESULT " + json.dumps(worker(args.worker, args.run_dir, args.steps, args.warmup, args.threads)))
        return
    if not (args.run_dir / "graph" / "meta.json").exists() or not (args.run_dir / "content").exists():
        sys.exit(f"{args.run_dir} lacks graph/ or content/: run `hir prepare` and `hir enrich` "
                 f"with hydra.run.dir={args.run_dir} first")
    results: dict[str, Any] = {}
    for mode in MODES:
        # one subprocess per model: its peak RSS is its own
        cmd = [sys.executable, __file__, "--worker", mode, "--run-dir", str(args.run_dir), "--steps", str(args.steps),
               "--warmup", str(args.warmup), "--threads", str(args.threads)]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
        line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
        if proc.returncode != 0 or line is None:
            sys.exit(f"{mode} failed:\n{proc.stderr[-4000:]}")
        results[mode] = json.loads(line.removeprefix("RESULT "))
        results[mode]["wall_s"] = round(time.perf_counter() - t0, 1)
        print(f"{mode:12s} {results[mode]['contexts_per_s']:9.1f} contexts/s  peak RSS {results[mode]['peak_rss_mib']:.0f} MiB")
    meta = json.loads((args.run_dir / "graph" / "meta.json").read_text())
    report = {
        "dataset": meta.get("dataset"), "nodes": meta.get("nodes"),
        "machine": {"cpus": os.cpu_count(), "threads": args.threads, "platform": platform.platform(),
                    "load_avg_1m_at_end": os.getloadavg()[0]},
        "results": results,
        "ratio_hir_encoder_vs_hgt": results["hir_encoder"]["contexts_per_s"] / results["hgt"]["contexts_per_s"],
        "ratio_hir_full_step_vs_hgt": results["hir_full"]["contexts_per_s"] / results["hgt"]["contexts_per_s"],
        "note": "contexts/s = seeds (incl. the pairs' users and entities) per second of training steps; "
                "hir_full = two views + EMA teacher + four loss parts, hir_encoder and hgt = one view, same loss",
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    print(f"hir encoder / HGT: {report['ratio_hir_encoder_vs_hgt']:.2f}x; full hir step / HGT: "
          f"{report['ratio_hir_full_step_vs_hgt']:.2f}x -> {args.out}")


if __name__ == "__main__":
    main()
