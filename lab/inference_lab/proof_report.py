"""The GPU proof's summary table and what it reads from the results."""

from __future__ import annotations

import itertools
import json
import statistics
from typing import Any

from inference_image.memory import decode_bytes_per_token
from inference_image.profiles import (
    Resolved,
)
from inference_image.tables import text_table

from . import gpu_bench
from .proof_plan import SPEC_BAR, SPEC_BAR_C1


def row_key(x: dict[str, Any]) -> tuple[str, int, str]:
    """A row's scenario, concurrency and how its requests sampled (older rows carry no
    sampling: vLLM's defaults, as a row sent with none): what a row is set against vanilla by."""
    return (x.get("scenario", "chat"), x["concurrency"],
            json.dumps(x.get("sampling") or {}, sort_keys=True))


def vanilla_rows(runs: dict[str, list[dict[str, Any]]]) -> dict[tuple[str, int, str],
                                                                 dict[str, Any]]:
    """Vanilla's row per row_key, from whichever vanilla step served it (a run may split
    vanilla by scenario or by concurrency). Where several starts served one key, the fastest: a
    start that waited out a one-off build (a Triton top-p kernel) would flatter every ratio set
    against it."""
    van: dict[tuple[str, int, str], dict[str, Any]] = {}
    for cfg in (c for c in runs if c.startswith("vanilla")):
        for x in runs[cfg]:
            k = row_key(x)
            if k not in van or x["output_tok_s"] > van[k]["output_tok_s"]:
                van[k] = x
    return van


def acceptance_needed(res: dict[str, Any]) -> list[dict[str, Any]]:
    """For one render (profile and plugin digests) served at two or more set acceptance lengths
    beside vanilla: the length a step would need to reach each of proof_plan's bars, per scenario
    and concurrency. Linear in tok/s between the measured lengths that bracket the bar: a step
    costs about the same whatever it accepts (docs/tiers/h200.md#speculative), so tok/s
    follows the length. A bar above the longest length measured is `beyond` (with 4.0 = k+1
    measured, no head of that chain reaches it); one the shortest already meets is `met`."""
    runs: dict[str, list[dict[str, Any]]] = res.get("runs", {})
    commands: dict[str, Any] = res.get("commands", {})
    van = vanilla_rows(runs)
    renders: dict[tuple[str, str], list[str]] = {}
    for cfg, cmd in commands.items():
        if isinstance(cmd, dict) and cmd.get("profile_sha256") and cfg in runs:
            renders.setdefault((cmd["profile_sha256"], cmd.get("plugin_sha256", "")), []).append(cfg)
    out = []
    for (digest, _), cfgs in renders.items():
        # keyed by the acceptance each step set, not the one it measured: two steps at the same
        # set length (a row and its repeat measure slightly different lengths) are one length twice,
        # and a line between them would be noise
        points: dict[tuple[str, int, str], dict[Any, list[tuple[float, float]]]] = {}
        for cfg in cfgs:
            cmd = commands[cfg]
            for x in runs[cfg]:
                if x.get("acceptance_length"):
                    al = float(x["acceptance_length"])
                    set_to = (cmd.get("acceptance_length") or tuple(cmd.get("acceptance_rates") or ())
                              or round(al, 2))
                    points.setdefault(row_key(x), {}).setdefault(set_to, []).append((al, x["output_tok_s"]))
        for (sc, c, smp), by_set in sorted(points.items()):
            v = van.get((sc, c, smp))
            if not v or not v["output_tok_s"] or len(by_set) < 2:
                continue
            pts = sorted((round(statistics.fmean(a for a, _ in xs), 3),
                          statistics.fmean(t for _, t in xs)) for xs in by_set.values())
            for bar in SPEC_BAR_C1 if c == 1 else (SPEC_BAR,):
                want = bar * v["output_tok_s"]
                row: dict[str, Any] = {
                    "render": digest[:12], "scenario": sc, "concurrency": c, "bar": bar,
                    "vanilla_tok_s": v["output_tok_s"],
                    "measured": [[al, round(tok / v["output_tok_s"], 2)] for al, tok in pts]}
                if want <= pts[0][1]:
                    row.update(status="met", needed_length=None)
                elif want > pts[-1][1]:
                    row.update(status="beyond", needed_length=None)
                else:
                    (a0, t0), (a1, t1) = next(
                        (p, q) for p, q in itertools.pairwise(pts) if p[1] < want <= q[1])
                    row.update(status="interpolated",
                               needed_length=round(a0 + (want - t0) * (a1 - a0) / (t1 - t0), 2))
                out.append(row)
    return out


def acceptance_lines(needed: list[dict[str, Any]]) -> list[str]:
    lines = []
    for n in needed:
        seen = ", ".join(f"{al} -> {x:.2f}x" for al, x in n["measured"])
        head = (f"acceptance for {n['bar']:.1f}x vanilla, {n['scenario']} c={n['concurrency']} "
                f"(render {n['render']}): ")
        lines.append(head + {
            "met": "met at every length measured",
            "beyond": "beyond the longest length measured",
            "interpolated": f"about {n['needed_length']} a step"}[n["status"]] + f" ({seen})")
    return lines


def ready_lines(res: dict[str, Any]) -> list[str]:
    """Each `ready` step's starts: where the time to the first answer went, phase by phase."""
    out = []
    for label, rec in res.get("ready", {}).items():
        for state in rec.get("order", []):
            e = rec.get("starts", {}).get(state, {})
            if "answered_s" not in e:
                continue
            phases = ", ".join(f"{name} {sec:.1f}" for name, sec in e.get("phases", []))
            out.append(f"start {label} {state}: first answer after {e['answered_s']:.1f} s "
                       f"({phases})")
        if b := rec.get("bundle"):
            out.append(f"bundle {label}: {b['files']} files, {b['cache_mib']} MiB of cache, "
                       f"{b['mib']} MiB packed")
    return out


def assemble(res: dict[str, Any], r: Resolved) -> str:
    """The summary table (printed last: what the device reply shows), with each config's ratio
    to vanilla, acceptance, the c=1 share of the memory roofline, and the acceptance each of
    proof_plan's bars needs where one render ran at several lengths."""
    runs: dict[str, list[dict[str, Any]]] = res.get("runs", {})
    van = vanilla_rows(runs)
    bw = (res.get("bandwidth") or {}).get("read_bw_tbs")
    ctx = 512 + 256  # mean context of a 512-in / 512-out request
    info = res.get("info") or {}
    # a machine a run gave no info or bandwidth step to says so, not "None"
    gpu = info.get("gpu") or (res.get("attention_model") or {}).get("gpu")
    if gpu and int(info.get("gpus") or 1) > 1:
        gpu = f"{info['gpus']} x {gpu}"
    if info.get("serials"):  # the tails tell two machines of one session apart
        gpu = f"{gpu} (serials {', '.join('...' + str(x)[-6:] for x in info['serials'])})"
    lines = [f"{gpu or 'GPU not recorded (no info step)'}  vLLM "
             f"{info.get('vllm', 'not recorded')}  read BW "
             f"{f'{bw} TB/s' if bw else 'not measured (no bandwidth step)'}  "
             "(TTFT, p99, TPOT, ITL99: ms)"]
    rows_out: list[list[object]] = [["config", "c", "tok/s", "x van", "TTFT", "p99", "TPOT",
                                     "ITL99", "AL", "drafted"]]
    roof = {}
    for cfg, rows in runs.items():
        for x in rows:
            sc = x.get("scenario", "chat")
            v = van.get(row_key(x))
            ratio = x["output_tok_s"] / v["output_tok_s"] if v and v["output_tok_s"] else 0
            al, share = x.get("acceptance_length"), x.get("drafted_step_share")
            name = cfg if sc == "chat" else f"{cfg} [{sc}]"
            # no vanilla row of that scenario and concurrency: a blank, not a ratio of 0
            shown = f"{ratio:.2f}" if ratio else "-"
            # a stream's worst waits: a stall in one row shows nowhere else in the table, its
            # TPOT barely above its neighbours'
            itl = x.get("itl_ms_p99")
            rows_out.append([name, x["concurrency"], f"{x['output_tok_s']:.1f}", shown,
                             f"{x['ttft_ms_mean']:.1f}", f"{x['ttft_ms_p99']:.1f}",
                             f"{x['tpot_ms_mean']:.2f}", f"{itl:.1f}" if itl else "",
                             al if al else "", f"{share:.0%}" if share is not None else ""])
        # the roofline's context is chat's (512 in, 512 out)
        c1 = next((x for x in rows if x["concurrency"] == 1
                   and x.get("scenario", "chat") == "chat"), None)
        if bw and c1 and c1["tpot_ms_mean"]:
            q, kv = ((("fp8" if "fp8" in cfg.split("-") else "none"), "auto") if cfg.startswith("vanilla")
                     else (r.profile.model.quantization, r.profile.model.kv_cache_dtype))
            ceiling = bw * 1e12 / decode_bytes_per_token(r.target, q, kv, ctx)
            # Output tokens per second of one stream over what one weight read per token allows:
            # a speculating config can pass 100 % (several tokens per read).
            roof[cfg] = {"tok_s": round(c1["output_tok_s"], 1), "roofline_tok_s": round(ceiling, 1),
                         "fraction": round(c1["output_tok_s"] / ceiling, 3)}
    res["roofline_c1"] = roof
    lines += text_table(rows_out, align="l" + "r" * (len(rows_out[0]) - 1)).split("\n")
    for cfg, rf in roof.items():
        # one decimal: a row just under the roofline target must not read as on it
        lines.append(f"roofline c=1 {cfg}: {rf['tok_s']} of {rf['roofline_tok_s']} tok/s "
                     f"= {rf['fraction']:.1%}")
    base = res.get("greedy", {}).get("draft-off")
    for cfg, g in res.get("greedy", {}).items():
        if base and cfg != "draft-off" and not cfg.startswith("vanilla"):
            same = sum(a["text"] == b["text"] for a, b in zip(base, g, strict=False))
            res.setdefault("greedy_vs_draft_off", {})[cfg] = f"{same} of {len(g)} identical"
            lines.append(f"greedy {cfg} vs draft-off: {same} of {len(g)} identical")
    for cfg, cmd in res.get("commands", {}).items():
        if not isinstance(cmd, dict):
            continue  # runs up to 26 recorded a vanilla step's command as a bare argv list
        if cmd.get("acceptance_applies_to"):
            lines.append(f"acceptance {cfg}: {cmd['acceptance_length']} set, applied to "
                         f"{cmd['acceptance_applies_to']} (the rows' AL is what it got)")
        lo, hi = cmd.get("published_length_range") or (None, None)
        if lo != hi:
            # a reader of the table must see that its acceptance is one end of what is published
            lines.append(f"acceptance {cfg}: {cmd['acceptance_length']} a step, where the published "
                         f"figure allows {lo}-{hi} for this chain")
    needed = acceptance_needed(res)
    if needed:
        res["acceptance_needed"] = needed
        lines += acceptance_lines(needed)
    # the warm-up rows: a kernel a server builds at its first batch of some size shows here as a
    # first-token tail, and a reader can tell whether the
    # measured rows still met one
    warm = [("after start", cfg, x) for cfg, x in res.get("after_start", {}).items()]
    warm += [("settle", cfg, x) for cfg, xs in res.get("settle", {}).items() for x in xs]
    for title, cfg, x in warm:
        lines.append(f"{title} {cfg}: c={x['concurrency']} {x['output_tok_s']:.1f} tok/s, TTFT "
                     f"mean {x['ttft_ms_mean']:.1f} p99 {x['ttft_ms_p99']:.1f} ms")
    for cfg, s in res.get("ready_s", {}).items():
        lines.append(f"ready {cfg}: {s['s']} s ({s['compile_cache']} compile cache)")
    lines += ready_lines(res)
    for cfg, checks in res.get("sampling_checks", {}).items():
        answered = [c["name"] for c in checks if c["ok"]]
        others = "; ".join(f"{c['name']} {'refused' if c.get('refused') else 'FAILED'}: "
                           f"{(c.get('error') or '')[:90]}" for c in checks if not c["ok"])
        lines.append(f"sampling {cfg}: answered {', '.join(answered) or 'none'}"
                     + (f"; {others}" if others else ""))
    lines += attention_lines(res.get("attention") or [])
    for cfg, why in res.get("failed", {}).items():
        lines.append(f"FAILED {cfg}: {why.splitlines()[0][:150]}")
    return "\n".join(lines)


def attention_lines(rows: list[dict[str, Any]]) -> list[str]:
    """Per step shape of the `attention` step: the cached contexts where the shipped route (vLLM's
    split-KV segment count) was quicker than FA3, and its time against FA3's at the longest."""
    lines = []
    shipped = f"triton_{gpu_bench.VLLM_SEGMENTS}_us"
    for step in dict.fromkeys(r["step"] for r in rows):
        own = sorted((r for r in rows if r["step"] == step), key=lambda r: r["context"])
        wins = [r["context"] for r in own if r[shipped] < r["fa3_us"]]
        last = own[-1]
        lines.append(f"attention {step}: the route quicker than FA3 at "
                     f"{', '.join(map(str, wins)) if wins else 'no'} cached tokens; at "
                     f"{last['context']} {last[shipped]} against {last['fa3_us']} us a layer")
    return lines


