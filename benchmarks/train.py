"""Benchmark `hir train`'s model against PyG's HGTConv on one snapshot (default completejourney).

    python benchmarks/train.py --run-dir outputs/completejourney/default   # needs graph/ + content/
    python benchmarks/train.py --run-dir ... --steps 30 --threads 2 --rank 128

Fair setup: both models get the *same seeds per batch and the same sampled neighbourhoods* (the
training batches `hir train` builds: its sampler's engagement-view contexts; for HGT each context
becomes typed edges token -> seed, edge type = (token type, relation x hop, seed type)) and the
*same input features* (hir's token encoder: the projection of the spectral base + type + role +
stage + content projection + numeric encodings). The spectral base is fitted once, before the
workers start, at a fixed rank (``--rank``, default 128, instead of the config's ``rank: auto``
search) and shared by all modes. What differs is the layer stack: 2 bias-aware transformer blocks
+ the M primitive tokens vs 2 ``torch_geometric.nn.HGTConv`` layers of the same width and heads;
both seeds' outputs go through hir's engagement-view output rule (a user: its base direction +
the zero-initialised correction ``W_s h``; an entity: its base). Both train with the same loss
(the catalogue softmax of the batch's deep-funnel pair users over every entity base + the
tokenizer's collapse guard) and AdamW; parameter counts are reported (learned weights only: the
spectral base, a fixed nodes x rank table fitted before training, is excluded from both).
Reported per model: seed contexts per second of a training step (forward + backward + optimizer)
and the peak RSS of its own subprocess; for hir also the full self-distillation step (two views +
EMA teacher + all loss parts of `HirModule.loss_parts`) and the sampler alone.

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
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

ROOT = Path(__file__).resolve().parents[1]
MODES = ("sampler", "hir_full", "hir_encoder", "hgt")
SEED = 0


def _defaults() -> dict[str, Any]:
    """conf/model, conf/datamodule and conf/spectral as `hir train` composes them (plain values)."""
    from omegaconf import OmegaConf

    conf = ROOT / "conf"
    cfg = OmegaConf.create({
        "seed": SEED, "paths": {"graph_dir": "", "content_dir": ""},
        "model": OmegaConf.load(conf / "model" / "hir.yaml"), "datamodule": OmegaConf.load(conf / "datamodule" / "default.yaml"),
        "spectral": OmegaConf.load(conf / "spectral" / "default.yaml"),
    })
    out = OmegaConf.to_container(cfg, resolve=True)
    for node in (out["model"]["net"], out["spectral"]):
        node.pop("_target_")
    return out


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _store(run_dir: Path, c: dict[str, Any], rank: int, basis_path: Path, reuse: bool):
    """The training snapshot and its spectral base (fitted at ``rank`` and saved to
    ``basis_path``, or reloaded from it with ``reuse``), as `hir train` builds them."""
    from hir.model import SpectralConfig, fit_base, load_graph

    store = load_graph(run_dir / "graph", run_dir / "content", ("train",), **c["datamodule"]["graph"])
    # a fixed rank: no validation set needed (only `rank: auto` chooses on it)
    basis, report = fit_base(store, None, SpectralConfig(**{**c["spectral"], "rank": rank}), SEED, basis_path, reuse)
    return store, basis, basis.base_for(store), report


def _batches(store, basis, base, c: dict[str, Any], n: int):
    """``n`` training batches, exactly as `HirDataModule.train_dataloader` builds them."""
    from hir.model import ContextSampler, catalogue
    from hir.train.datamodule import TrainBatches

    d = c["datamodule"]
    ds = TrainBatches(store, base, ContextSampler(store, **d["context"]), d["batch_size"], d["pairs"],
                      d["seeds_per_epoch"], seed=SEED, catalogue=catalogue(store, base))
    t0 = time.perf_counter()
    batches = [ds[(0, i % len(ds))] for i in range(n)]
    return batches, time.perf_counter() - t0


class HGTNet:
    """hir's token encoder for node features, 2 HGTConv layers over the context star graphs, hir's
    engagement-view output rule and tokenizer (for the collapse-guard loss)."""

    def __init__(self, store, net_kw: dict[str, Any], edge_types: list[tuple[str, str, str]]) -> None:
        import torch
        from torch_geometric.nn import HGTConv

        from hir.nn import HirNet

        # hir's network without its layer stack: encoder, output heads, tokenizer
        self.hir = HirNet(**net_kw)
        del self.hir.transformer
        self.hir.primitive = None
        # prototypes follow online k-means in hir, not gradients (as HirModule freezes them)
        for p in (self.hir.tokenizer.root, *self.hir.tokenizer.residuals):
            p.requires_grad_(False)
        self.types = list(store.types)
        self.convs = torch.nn.ModuleList(
            HGTConv(net_kw["width"], net_kw["width"], (self.types, edge_types), heads=net_kw["heads"])
            for _ in range(net_kw["depth"])
        )
        self.modules = torch.nn.ModuleList([self.hir, self.convs])
        self.tokenizer = self.hir.tokenizer

    def parameters(self):
        return self.modules.parameters()

    def semantic(self, z):
        return self.hir.semantic(z)

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
        # each distinct node's row of the batch's content and base matrices
        row = torch.empty_like(uniq)
        row[inv] = eng["row"][mask]
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
        return {"uniq": uniq, "ntype": ntype, "pos": pos, "seed_rows": local[:, 0], "row": row[:, None],
                "edge_index": {k: torch.tensor(v, dtype=torch.long) for k, v in edges.items()},
                "exposure": torch.from_numpy(store.exposure)[uniq][:, None]}

    def __call__(self, batch: dict[str, Any], g: dict[str, Any]) -> Any:
        import torch
        import torch.nn.functional as F

        from hir.nn.net import USER_TYPE

        net = self.hir
        uniq, ntype, pos = g["uniq"], g["ntype"], g["pos"]
        z0 = torch.zeros_like(uniq[:, None])
        # node features: the token encoder (base projection on) on each distinct node as its own
        # seed (no context features)
        feats = net.encoder({
            "row": g["row"], "content": batch["content"], "base": batch["base"], "type": ntype[:, None],
            "relation": z0, "hop": z0, "stage": z0, "count": z0.float(), "age": z0.float(), "exposure": g["exposure"],
        }, use_ids=True)[:, 0]  # (U, C)
        x_dict = {t: feats[ntype == ti] for ti, t in enumerate(self.types) if bool((ntype == ti).any())}
        for conv in self.convs:
            out = conv(x_dict, g["edge_index"])
            x_dict = {t: (out[t] if out.get(t) is not None else x) for t, x in x_dict.items()}
        seed_types = ntype[g["seed_rows"]]
        h = torch.zeros(len(seed_types), feats.shape[1])  # (B, C) the seeds' outputs
        for ti, t in enumerate(self.types):
            sel = seed_types == ti
            if sel.any():
                h[sel] = x_dict[t][pos[g["seed_rows"][sel]]]
        # HirNet.encode's engagement-view output: a user refines its base direction, an entity
        # keeps its base, a seed without a base takes the knowledge form
        row0 = batch["eng"]["row"][:, 0].clamp_min(0)
        base = batch["seed_base"].float()  # (B, K)
        has = (base.norm(dim=-1) > 0)[:, None]
        refine = (seed_types == USER_TYPE)[:, None].float()
        d = torch.where(has, F.normalize(base, dim=-1) + refine * net.head(h), net.know_head(h))
        logit = torch.where(has[:, 0], batch["base_logit"][row0].float(),
                            net.know_scale(h).squeeze(-1) + net.know_offset[seed_types])
        return net.pack(F.normalize(d, dim=-1), logit, seed_types)  # (B, K + 1)


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


def _simple_loss(o: dict[str, Any], levels: tuple[int, ...]):
    """The loss of ``hir_encoder`` and ``hgt``: the catalogue softmax of the batch's pair users
    (their embeddings (P, K + 1) against the catalogue's packed bases) + the tokenizer's collapse
    guard on every seed's direction. Returns ``loss(z, semantic, batch, catalogue, tokenizer)``."""
    from hir.nn import BalanceLoss, CatalogueLoss

    cat_loss = CatalogueLoss(o["catalogue_temp"], learn_temperature=False)
    balance = BalanceLoss(levels, o["student_temp"])

    def loss(z, semantic, batch, cat, tokenizer):
        p = int(batch["n_pairs"])
        part = cat_loss(z[:p], cat, batch["cat_target"], batch["cat_mask_rows"], batch["cat_mask_cols"])
        total = part + balance([tokenizer.scores(semantic)])
        if not bool(total.isfinite()):
            raise RuntimeError(f"non-finite benchmark loss {total.item()} (catalogue part {part.item()})")
        return total

    return loss


def worker(mode: str, run_dir: Path, steps: int, warmup: int, threads: int, rank: int, basis_path: Path) -> dict[str, Any]:
    import torch

    from hir.model import catalogue_vectors, views
    from hir.nn import HirNet
    from hir.train.module import HirModule

    torch.set_num_threads(threads)
    torch.manual_seed(SEED)
    c = _defaults()
    m = c["model"]
    store, basis, base, _ = _store(run_dir, c, rank, basis_path, reuse=True)
    batches, t_sample = _batches(store, basis, base, c, steps + warmup)
    seeds_per_batch = int(batches[0]["seeds"].shape[0])
    out: dict[str, Any] = {"mode": mode, "seed_contexts_per_batch": seeds_per_batch,
                           "pairs_per_batch": int(batches[0]["n_pairs"]), "steps": steps}
    if mode == "sampler":
        out["contexts_per_s"] = seeds_per_batch * len(batches) / t_sample
        out["peak_rss_mib"] = _rss_mib()
        return out
    rss_before = _rss_mib()
    sizes = {k: store.spec[k] for k in ("n_types", "n_stages", "content_dim", "n_recency")}
    net_kw = {**m["net"], **sizes, "base_dim": basis.rank}
    cat = catalogue_vectors(store, base)
    out["catalogue"] = int(cat.shape[0])
    if mode.startswith("hir"):
        net = HirNet(**net_kw)
        module = HirModule(net, m["objective"], m["optim"], m["val_k"], m["monitor_k"], seed=SEED)
        module._catalogue = cat  # set by on_fit_start under Lightning
        params = [p for p in module.parameters() if p.requires_grad]
        out["parameters"] = sum(p.numel() for p in net.parameters())
        loss_fn = _simple_loss(m["objective"], net.tokenizer.levels)

        def step(b):
            if mode == "hir_full":
                loss = sum(module.weights[k] * v for k, v in module.loss_parts(b).items())
            else:
                eng, _ = views(b)
                z = net(eng, use_ids=True)
                loss = loss_fn(z, net.semantic(z), b, cat, net.tokenizer)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if mode == "hir_full":
                module.on_train_batch_end(None, b, 0)
    else:
        hgt = HGTNet(store, net_kw, _edge_types(batches, store))
        t0 = time.perf_counter()
        graphs = [hgt.prepare(b, store) for b in batches]
        out["graph_prep_s_per_batch"] = (time.perf_counter() - t0) / len(batches)
        for b, g in zip(batches, graphs):
            b["graph"] = g
        params = [p for p in hgt.parameters() if p.requires_grad]
        out["parameters"] = sum(p.numel() for p in hgt.parameters())
        out["edge_types"] = len(hgt.convs[0].edge_types)
        loss_fn = _simple_loss(m["objective"], hgt.tokenizer.levels)

        def step(b):
            z = hgt(b, b["graph"])
            loss = loss_fn(z, hgt.semantic(z), b, cat, hgt.tokenizer)
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
    ap.add_argument("--rank", type=int, default=128, help="spectral rank (fixed: no `rank: auto` search)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "train.json")
    ap.add_argument("--worker", choices=MODES, help=argparse.SUPPRESS)
    ap.add_argument("--basis", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        result = worker(args.worker, args.run_dir, args.steps, args.warmup, args.threads, args.rank, args.basis)
        print("RESULT " + json.dumps(result))
        return
    if not (args.run_dir / "graph" / "meta.json").exists() or not (args.run_dir / "content").exists():
        sys.exit(f"{args.run_dir} lacks graph/ or content/: run `hir prepare` and `hir enrich` "
                 f"with hydra.run.dir={args.run_dir} first")
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="hir_train_bench_") as tmp:
        # one spectral fit, shared by every mode (the workers reload it)
        basis_path = Path(tmp) / "spectral.npz"
        _, basis, _, spectral = _store(args.run_dir, _defaults(), args.rank, basis_path, reuse=False)
        spectral |= {"requested_rank": args.rank, "fixed_rank": True}
        print(f"spectral base: rank {basis.rank} in {spectral['seconds']:.1f}s")
        for mode in MODES:
            # one subprocess per model: its peak RSS is its own
            cmd = [sys.executable, __file__, "--worker", mode, "--run-dir", str(args.run_dir), "--steps", str(args.steps),
                   "--warmup", str(args.warmup), "--threads", str(args.threads), "--rank", str(args.rank),
                   "--basis", str(basis_path)]
            t0 = time.perf_counter()
            proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
            line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
            if proc.returncode != 0 or line is None:
                sys.exit(f"{mode} failed:\n{proc.stderr[-4000:]}")
            results[mode] = json.loads(line.removeprefix("RESULT "))
            results[mode]["wall_s"] = round(time.perf_counter() - t0, 1)
            print(f"{mode:12s} {results[mode]['contexts_per_s']:9.1f} contexts/s  "
                  f"peak RSS {results[mode]['peak_rss_mib']:.0f} MiB")
    meta = json.loads((args.run_dir / "graph" / "meta.json").read_text())
    report = {
        "dataset": meta.get("dataset"), "nodes": meta.get("nodes"),
        "machine": {"cpus": os.cpu_count(), "threads": args.threads, "platform": platform.platform(),
                    "load_avg_1m_at_end": os.getloadavg()[0]},
        "spectral": spectral,
        "results": results,
        "ratio_hir_encoder_vs_hgt": results["hir_encoder"]["contexts_per_s"] / results["hgt"]["contexts_per_s"],
        "ratio_hir_full_step_vs_hgt": results["hir_full"]["contexts_per_s"] / results["hgt"]["contexts_per_s"],
        "note": "contexts/s = seeds (incl. the pairs' users) per second of training steps; hir_full = two views + "
                "EMA teacher + every loss part of HirModule.loss_parts, hir_encoder and hgt = one view, same loss "
                "(catalogue + collapse guard); the spectral base is fitted once at the fixed rank --rank (not the "
                "config's rank: auto search); parameters = learned weights (the spectral base is not one)",
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    print(f"hir encoder / HGT: {report['ratio_hir_encoder_vs_hgt']:.2f}x; full hir step / HGT: "
          f"{report['ratio_hir_full_step_vs_hgt']:.2f}x -> {args.out}")


if __name__ == "__main__":
    main()
