"""Ranking statistics of every predictor against the realised shift, and the post-hoc predictors."""

from __future__ import annotations

import math

import numpy as np

from avalanche_plugins.core.stats import direction_consistency, kendall_tau, spearman
from benchmarks.ads_zoo.zoo import Arch, one_edit_pairs

PREDICTORS = ("ads_logit", "ads_logit_calibrated", "ads_loss", "ads", "ads_probe", "ads_topology",
              "first_order_logit", "first_order_loss", "first_step", "first_step_logit", "new_loss", "n_params")
STATS = ("spearman", "kendall", "direction_consistency", "ece_spearman", "ece_increase_spearman",
         "spearman_mlp", "spearman_vit")  # per predictor, in the report's column order


def add_topology_only(rows: list[dict]) -> None:
    """``ads_topology`` (docs/benchmarks.md): ``topology_only_shift`` on the stored terms."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["scenario"], r["seed"], r["design"]), []).append(r)
    for members in groups.values():
        members.sort(key=lambda r: sum(r["architecture_terms"]))
        ref = members[len(members) // 2]
        for r in members:
            ok = len(r["data_terms"]) == len(ref["data_terms"])
            r["ads_topology"] = (ref["path_factor"] * sum(n * d for n, d in zip(r["architecture_terms"], ref["data_terms"]))
                                 if ok else None)


def add_first_step_logit(rows: list[dict]) -> None:
    """``first_step_logit`` (docs/benchmarks.md); ``new_loss`` is stored by every job already."""
    for r in rows:
        ok = r.get("first_step") is not None and r.get("logit_path_factor") is not None
        r["first_step_logit"] = r["first_step"] * r["logit_path_factor"] if ok else None


def add_family_calibrated(rows: list[dict]) -> None:
    """``ads_logit_calibrated``: ``ADS · shift_ref / ADS_ref`` per (scenario, seed, family), the
    reference (None) the member with the median ADS (docs/benchmarks.md, "benchmarks.ads_zoo")."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        if r.get("realised_shift") is not None and r.get("ads_logit") is not None:
            groups.setdefault((r["scenario"], r["seed"], r["family"]), []).append(r)
    for members in groups.values():
        members.sort(key=lambda r: r["ads_logit"])
        ref = members[len(members) // 2]
        scale = ref["realised_shift"] / ref["ads_logit"] if ref["ads_logit"] > 0 else float("nan")
        for r in members:
            r["ads_logit_calibrated"] = None if r is ref else r["ads_logit"] * scale
            r["calibration_reference"] = r is ref


def statistics(rows: list[dict], archs: list[Arch]) -> dict:
    """Ranking statistics of every predictor on one (scenario, seed) set of rows."""
    by_name = {r["arch"]: r for r in rows if r.get("realised_shift") is not None}
    pairs = [(archs[i].name, archs[j].name) for i, j in one_edit_pairs(archs)
             if archs[i].name in by_name and archs[j].name in by_name]
    names = list(by_name)
    shift = {n: by_name[n]["realised_shift"] for n in names}
    ece = {n: by_name[n]["ece_after"] for n in names}
    dece = {n: by_name[n]["ece_after"] - by_name[n]["ece_before"] for n in names}
    out = {"n_archs": len(names), "n_pairs": len(pairs), "n_diverged": sum(r.get("diverged", False) for r in rows)}
    for p in PREDICTORS:
        values = {n: by_name[n].get(p) for n in names}
        keep = [n for n in names if values[n] is not None and math.isfinite(values[n])]
        if len(keep) < 3:
            continue
        v = [values[n] for n in keep]
        s = [shift[n] for n in keep]
        stats = {"spearman": spearman(v, s), "kendall": kendall_tau(v, s),
                 "ece_spearman": spearman(v, [ece[n] for n in keep]),
                 "ece_increase_spearman": spearman(v, [dece[n] for n in keep])}
        for family in ("mlp", "vit"):
            fam = [i for i, n in enumerate(keep) if by_name[n]["family"] == family]
            if len(fam) >= 3:
                stats[f"spearman_{family}"] = spearman([v[i] for i in fam], [s[i] for i in fam])
        ps = [(a, b) for a, b in pairs if values[a] is not None and values[b] is not None]
        try:
            stats["direction_consistency"] = direction_consistency(ps, values, shift)
        except ValueError:
            stats["direction_consistency"] = float("nan")
        out[p] = stats
    return out


def _total(rows: list[dict], key: str) -> float:
    return float(sum(r[key] for r in rows))


def analyse(rows: list[dict], archs: list[Arch], scenarios: list[str], seeds: list[int]) -> dict:
    add_topology_only(rows)
    add_first_step_logit(rows)
    add_family_calibrated(rows)
    per_scenario = {}
    for scenario in scenarios:
        seed_stats = []
        for seed in seeds:
            part = [r for r in rows if r["scenario"] == scenario and r["seed"] == seed]
            if part:
                seed_stats.append(statistics(part, [a for a in archs if a.name in {r["arch"] for r in part}]))
        part = [r for r in rows if r["scenario"] == scenario]
        if part:
            per_scenario[scenario] = _scenario_entry(part, seed_stats)
    return per_scenario


def _scenario_entry(part: list[dict], seed_stats: list[dict]) -> dict:
    """A scenario's statistics (mean and std over seeds) and its cost ratios."""
    entry = {"per_seed": seed_stats, "n_archs": seed_stats[0]["n_archs"], "n_pairs": seed_stats[0]["n_pairs"]}
    for p in PREDICTORS:
        for stat in STATS:
            vals = np.array([s[p].get(stat, np.nan) for s in seed_stats if p in s], dtype=float)
            entry[f"{p}_{stat}_mean"] = float(np.nanmean(vals)) if len(vals) and np.isfinite(vals).any() else float("nan")
            entry[f"{p}_{stat}_std"] = float(np.nanstd(vals, ddof=1)) if np.isfinite(vals).sum() > 1 else 0.0
    entry["time_ratio_median"] = float(np.median(np.array([r["time_ratio"] for r in part])))
    entry["time_ratio_total"] = _total(part, "ads_s") / _total(part, "truth_s")
    entry["probe_time_ratio_total"] = _total(part, "ads_probe_s") / _total(part, "truth_s")
    if all("ads_cpu_s" in r for r in part):  # process CPU time: robust to a shared machine
        entry["cpu_time_ratio_total"] = _total(part, "ads_cpu_s") / max(_total(part, "truth_cpu_s"), 1e-12)
    refs = [r for r in part if r.get("calibration_reference")]
    if refs:  # ADS for every architecture plus the references' ground truth, over the ground truth avoided
        avoided = [r for r in part if not r.get("calibration_reference")]
        entry["calibrated_time_ratio_total"] = float(
            (_total(part, "ads_s") + _total(refs, "truth_s")) / max(_total(avoided, "truth_s"), 1e-12))
    for family in ("mlp", "vit"):  # what separates the families (docs/ads.md)
        fam = [r for r in part if r["family"] == family and r.get("realised_shift") is not None]
        if fam:
            entry[f"{family}_time_ratio_total"] = _total(fam, "ads_s") / _total(fam, "truth_s")
            entry[f"{family}_time_ratio_min"] = float(min(r["time_ratio"] for r in fam))  # the cheapest job
            entry[f"{family}_acc_old_before"] = float(np.mean([r["acc_old_before"] for r in fam]))
            entry[f"{family}_realised_shift_median"] = float(np.median([r["realised_shift"] for r in fam]))
            if all(r.get("ads_logit") for r in fam):
                entry[f"{family}_shift_over_ads_logit_median"] = float(
                    np.median([r["realised_shift"] / r["ads_logit"] for r in fam]))
    entry["ads_seconds_total"] = _total(part, "ads_s")
    entry["truth_seconds_total"] = _total(part, "truth_s")
    entry["spearman_target_met"] = bool(entry["ads_logit_spearman_mean"] >= 0.8)
    return entry
