#!/usr/bin/env python3
"""Writes the Grafana dashboards of the chart (charts/ferrotrain/files/dashboards/*.json):
`ferrotrain / job` (one DistributedTraining) and `ferrotrain / fleet` (every job and the
operator). The panels query the series the operator and rank 0 export, labelled as the chart's
ServiceMonitor and PodMonitor label them (`namespace`, `job` = the DistributedTraining).

    scripts/gen-dashboards.py            # rewrite the JSON files
    scripts/gen-dashboards.py --check    # exit 1 when they differ from what this writes

operator/tests/chart_monitoring.rs runs --check, and checks that every metric the queries name
is exported."""
import json

DS = {"type": "prometheus", "uid": "${datasource}"}


def var_ds():
    return {"name": "datasource", "label": "Data source", "type": "datasource",
            "query": "prometheus", "current": {}, "hide": 0, "refresh": 1}


def var_query(name, label, query, multi=False, include_all=False):
    return {"name": name, "label": label, "type": "query", "datasource": DS,
            "query": {"query": query, "refId": name}, "definition": query,
            "refresh": 2, "sort": 1, "multi": multi, "includeAll": include_all,
            "current": {}, "hide": 0}


class Layout:
    """Places panels left to right on Grafana's 24-column grid, rows of them downwards."""

    def __init__(self):
        self.y = 0
        self.x = 0
        self.h = 0
        self.id = 0

    def pos(self, w, h):
        if self.x + w > 24:
            self.y += self.h
            self.x = 0
            self.h = 0
        p = {"x": self.x, "y": self.y, "w": w, "h": h}
        self.x += w
        self.h = max(self.h, h)
        self.id += 1
        return p, self.id

    def row(self, title):
        if self.x:
            self.y += self.h
            self.x = 0
            self.h = 0
        self.id += 1
        r = {"type": "row", "title": title, "collapsed": False, "panels": [], "id": self.id,
             "gridPos": {"x": 0, "y": self.y, "w": 24, "h": 1}}
        self.y += 1
        return r


def target(expr, legend="", ref="A", instant=False, fmt=None):
    t = {"datasource": DS, "expr": expr, "legendFormat": legend, "refId": ref}
    if instant:
        t["instant"] = True
        t["range"] = False
    if fmt:
        t["format"] = fmt
    return t


def panel(layout, kind, title, desc, targets, w=8, h=8, unit=None, extra=None):
    pos, pid = layout.pos(w, h)
    p = {"type": kind, "title": title, "description": desc, "datasource": DS, "gridPos": pos,
         "id": pid, "targets": [dict(t, refId=chr(65 + i)) for i, t in enumerate(targets)],
         "fieldConfig": {"defaults": {}, "overrides": []}, "options": {}}
    if unit:
        p["fieldConfig"]["defaults"]["unit"] = unit
    if kind == "timeseries":
        p["options"] = {"legend": {"displayMode": "list", "placement": "bottom"},
                        "tooltip": {"mode": "multi"}}
    if extra:
        p.update(extra)
    return p


def dashboard(uid, title, desc, templating, panels):
    return {"uid": uid, "title": title, "description": desc, "tags": ["ferrotrain"],
            "editable": True, "schemaVersion": 39, "version": 1,
            "time": {"from": "now-6h", "to": "now"}, "refresh": "30s", "timezone": "",
            "graphTooltip": 1, "templating": {"list": templating},
            "annotations": {"list": []}, "links": [], "panels": panels}


# One job.
L = Layout(); sel = 'namespace="$namespace", job="$job"'
P = []
P.append(L.row("Progress"))
P.append(panel(L, "stat", "Step", "Optimizer steps completed, of totalSteps.",
    [target(f"ferrotrain_step{{{sel}}}", "step", instant=True), target(f"ferrotrain_total_steps{{{sel}}}", "of", instant=True)], w=6, h=4))
P.append(panel(L, "stat", "ETA", "Time until totalSteps at the current rate, evaluations included (rank 0's etaSeconds).",
    [target(f"ferrotrain_eta_seconds{{{sel}}}", "ETA", instant=True)], w=6, h=4, unit="s"))
P.append(panel(L, "stat", "Phase", "The DistributedTraining's phase (status.phase).",
    [target(f'ferrotrain_operator_job_phase{{{sel}}} == 1', "{{phase}}", instant=True)], w=6, h=4,
    extra={"options": {"textMode": "name", "reduceOptions": {"calcs": ["lastNotNull"]}}}))
P.append(panel(L, "stat", "World size", "Ranks exchanging gradients (fewer than the gang while an elastic job trains without a pod).",
    [target(f"ferrotrain_world_size{{{sel}}}", "ranks", instant=True)], w=6, h=4))
P.append(panel(L, "timeseries", "Step rate", "Optimizer steps per second and source+target tokens per second (recent averages).",
    [target(f"ferrotrain_steps_per_second{{{sel}}}", "steps/s"), target(f"ferrotrain_tokens_per_second{{{sel}}} / 1000", "k tokens/s")], w=12))
P.append(panel(L, "timeseries", "Loss", "Training loss (label-smoothed, recent average), validation loss at each evaluation and its best so far.",
    [target(f"ferrotrain_loss{{{sel}}}", "train"), target(f"ferrotrain_eval_loss{{{sel}}}", "eval"), target(f"ferrotrain_best_eval_loss{{{sel}}}", "best eval")], w=12))
P.append(panel(L, "timeseries", "Eval BLEU", "Corpus BLEU on the validation set at the last evaluation (sacreBLEU 13a, cased).",
    [target(f"ferrotrain_eval_bleu{{{sel}}}", "BLEU")], w=12))
P.append(panel(L, "timeseries", "ETA", "Seconds until training ends, as rank 0 estimates them (steps left at the recent rate, evaluations to come, capped by maxSeconds).",
    [target(f"ferrotrain_eta_seconds{{{sel}}}", "ETA")], w=12, unit="s"))
P.append(L.row("Restarts and goodput"))
P.append(panel(L, "stat", "Goodput", "Share of the job's wall time spent on training steps it kept (status.recovery.goodputPercent).",
    [target(f"ferrotrain_operator_job_goodput_percent{{{sel}}}", "goodput", instant=True)], w=6, h=6, unit="percent"))
P.append(panel(L, "stat", "Restarts", "Restarts counted against maxRestarts (status.restarts).",
    [target(f"ferrotrain_operator_job_restarts{{{sel}}}", "restarts", instant=True)], w=6, h=6))
P.append(panel(L, "stat", "Steps lost", "Steps trained twice because an attempt or round ended after its last checkpoint.",
    [target(f"ferrotrain_operator_job_lost_steps{{{sel}}}", "steps", instant=True)], w=6, h=6))
P.append(panel(L, "stat", "Since the last checkpoint", "Time since the newest complete checkpoint: what a failure now would cost.",
    [target(f"time() - ferrotrain_last_checkpoint_timestamp_seconds{{{sel}}}", "age", instant=True)], w=6, h=6, unit="s"))
P.append(panel(L, "timeseries", "Restarts and goodput over time", "The job's restarts and goodput; kubectl describe dt shows each restart's reason (lastFailure, restartsByCause).",
    [target(f"ferrotrain_operator_job_restarts{{{sel}}}", "restarts"), target(f"ferrotrain_operator_job_goodput_percent{{{sel}}}", "goodput %")], w=12))
P.append(panel(L, "timeseries", "Restarts by reason (every job)", "Restarts in place or of the whole gang by reason, all jobs together: the operator counts reasons fleet-wide.",
    [target("sum by (reason) (increase(ferrotrain_operator_gang_restarts_total[1h]))", "{{reason}}")], w=12))
P.append(L.row("Where the time goes"))
P.append(panel(L, "timeseries", "commFraction", "Share of each step spent waiting on the gradient exchange: above 0.6 the network or a slow peer is the bottleneck.",
    [target(f"ferrotrain_comm_fraction{{{sel}}}", "commFraction")], w=12, unit="percentunit"))
P.append(panel(L, "timeseries", "Step time", "Wall-clock seconds per optimizer step (recent average) and the part spent waiting on the exchange.",
    [target(f"ferrotrain_step_time_seconds{{{sel}}}", "step"), target(f"ferrotrain_step_time_seconds{{{sel}}} * ferrotrain_comm_fraction{{{sel}}}", "waiting")], w=12, unit="s"))
P.append(panel(L, "timeseries", "CPU per rank", "Every rank's CPU seconds per second, summarised by rank 0: mean, min and max over the ranks (a min far below the mean is a starved rank), and rank 0's own process.",
    [target(f'ferrotrain_gang_cpu_utilization{{{sel}, stat=~"mean|min|max"}}', "{{stat}}"),
     target(f"rate(ferrotrain_process_cpu_seconds_total{{{sel}}}[5m])", "rank 0")], w=12))
P.append(panel(L, "timeseries", "Rank at the extremes", "Which rank has the least and the most CPU time (min_rank, max_rank).",
    [target(f'ferrotrain_gang_cpu_utilization{{{sel}, stat=~"min_rank|max_rank"}}', "CPU {{stat}}")], w=12))
P.append(panel(L, "timeseries", "GPU per rank", "GPU utilisation over the ranks (mean, min, max; CUDA ranks with NVML), and rank 0's GPU.",
    [target(f'ferrotrain_gang_gpu_utilization{{{sel}, stat=~"mean|min|max"}}', "{{stat}}"),
     target(f"ferrotrain_gpu_utilization{{{sel}}}", "rank 0")], w=12, unit="percentunit"))
P.append(panel(L, "timeseries", "Memory per rank", "Resident memory over the ranks (max: the rank nearest its limit) and GPU memory in use.",
    [target(f'ferrotrain_gang_resident_memory_bytes{{{sel}, stat=~"mean|max"}}', "host {{stat}}"),
     target(f'ferrotrain_gang_gpu_memory_used_bytes{{{sel}, stat=~"mean|max"}}', "GPU {{stat}}")], w=12, unit="bytes"))
P.append(L.row("Security"))
P.append(panel(L, "timeseries", "Rejected connections", "Connections refused by the rendezvous store or rank 0's ring listener, per 10 minutes, by reason (docs/security.md).",
    [target(f"increase(ferrotrain_rejected_connections_total{{{sel}}}[10m])", "{{reason}}")], w=24))
job = dashboard("ferrotrain-job", "ferrotrain / job",
    "One DistributedTraining: progress, evaluation, ETA, restarts and goodput, where the step time goes, CPU and GPU over its ranks, refused connections.",
    [var_ds(), var_query("namespace", "Namespace", "label_values(ferrotrain_step, namespace)"),
     var_query("job", "Job", 'label_values(ferrotrain_step{namespace="$namespace"}, job)')], P)

# The fleet.
L = Layout(); ns = 'namespace=~"$namespace"'
P = []
P.append(L.row("Jobs"))
P.append(panel(L, "timeseries", "Jobs by phase", "DistributedTrainings by status.phase.",
    [target("sum by (phase) (ferrotrain_operator_jobs)", "{{phase}}")], w=12, extra={"fieldConfig": {"defaults": {"custom": {"stacking": {"mode": "normal"}}}, "overrides": []}}))
P.append(panel(L, "table", "Running jobs", "Each job rank 0 reports: steps/s, ETA, commFraction; with the operator's goodput and restarts.",
    [target(f"ferrotrain_steps_per_second{{{ns}}}", "", instant=True, fmt="table"),
     target(f"ferrotrain_eta_seconds{{{ns}}}", "", instant=True, fmt="table"),
     target(f"ferrotrain_comm_fraction{{{ns}}}", "", instant=True, fmt="table"),
     target(f"ferrotrain_operator_job_goodput_percent{{{ns}}}", "", instant=True, fmt="table"),
     target(f"ferrotrain_operator_job_restarts{{{ns}}}", "", instant=True, fmt="table")], w=12,
    extra={"transformations": [{"id": "joinByField", "options": {"byField": "job", "mode": "outer"}},
                                {"id": "filterFieldsByName", "options": {"include": {"pattern": "^(namespace.*|job|Value.*)$"}}}]}))
P.append(panel(L, "timeseries", "Step rate", "Steps per second of every job.",
    [target(f"ferrotrain_steps_per_second{{{ns}}}", "{{namespace}}/{{job}}")], w=12))
P.append(panel(L, "timeseries", "Goodput", "Each job's share of wall time spent on steps it kept.",
    [target(f"ferrotrain_operator_job_goodput_percent{{{ns}}}", "{{namespace}}/{{job}}")], w=12, unit="percent"))
P.append(panel(L, "timeseries", "Loss", "Training loss of every job.",
    [target(f"ferrotrain_loss{{{ns}}}", "{{namespace}}/{{job}}")], w=12))
P.append(panel(L, "timeseries", "Eval BLEU", "Validation BLEU of every job at its last evaluation.",
    [target(f"ferrotrain_eval_bleu{{{ns}}}", "{{namespace}}/{{job}}")], w=12))
P.append(L.row("Restarts and recovery"))
P.append(panel(L, "timeseries", "Restarts by reason", "Restarts in place or of the whole gang per hour, by reason (lastFailure.reason: Killed, ExitCode, PodLeaving, NodeLost, Disrupted, ...).",
    [target("sum by (reason) (increase(ferrotrain_operator_gang_restarts_total[1h]))", "{{reason}}")], w=12))
P.append(panel(L, "timeseries", "Restarts per job", "status.restarts of each job.",
    [target(f"ferrotrain_operator_job_restarts{{{ns}}}", "{{namespace}}/{{job}}")], w=12))
P.append(panel(L, "timeseries", "Failure to the next step", "From a rank's failure to the next attempt's or round's first step, and from the failure to the operator acting on it (p50, p90 over an hour).",
    [target("histogram_quantile(0.5, sum by (le) (rate(ferrotrain_operator_recovery_seconds_bucket[1h])))", "recovery p50"),
     target("histogram_quantile(0.9, sum by (le) (rate(ferrotrain_operator_recovery_seconds_bucket[1h])))", "recovery p90"),
     target("histogram_quantile(0.9, sum by (le) (rate(ferrotrain_operator_failure_detect_seconds_bucket[1h])))", "detect p90")], w=12, unit="s"))
P.append(panel(L, "timeseries", "Steps lost", "Steps each job trained twice.",
    [target(f"ferrotrain_operator_job_lost_steps{{{ns}}}", "{{namespace}}/{{job}}")], w=12))
P.append(L.row("Resources and the network"))
P.append(panel(L, "timeseries", "commFraction", "Share of each job's steps spent waiting on the gradient exchange.",
    [target(f"ferrotrain_comm_fraction{{{ns}}}", "{{namespace}}/{{job}}")], w=12, unit="percentunit"))
P.append(panel(L, "timeseries", "Slowest rank's CPU", "The least busy rank of each job (CPU seconds per second): a starved rank slows the whole gang.",
    [target(f'ferrotrain_gang_cpu_utilization{{{ns}, stat="min"}}', "{{namespace}}/{{job}}")], w=12))
P.append(panel(L, "timeseries", "GPU utilisation (mean over the ranks)", "Mean GPU utilisation of each job's ranks.",
    [target(f'ferrotrain_gang_gpu_utilization{{{ns}, stat="mean"}}', "{{namespace}}/{{job}}")], w=12, unit="percentunit"))
P.append(panel(L, "timeseries", "Rejected connections", "Connections refused per 10 minutes, by job and reason.",
    [target(f"sum by (namespace, job, reason) (increase(ferrotrain_rejected_connections_total{{{ns}}}[10m]))", "{{namespace}}/{{job}} {{reason}}")], w=12))
P.append(L.row("The operator"))
P.append(panel(L, "timeseries", "Reconciles", "Reconciles per second by result, and failed ones by error kind.",
    [target("sum by (result) (rate(ferrotrain_operator_reconciles_total[5m]))", "{{result}}"),
     target("sum by (error) (rate(ferrotrain_operator_reconcile_errors_total[5m]))", "error {{error}}")], w=8))
P.append(panel(L, "timeseries", "Reconcile duration p99", "99th percentile of one reconcile's duration.",
    [target("histogram_quantile(0.99, sum by (le) (rate(ferrotrain_operator_reconcile_duration_seconds_bucket[5m])))", "p99")], w=8, unit="s"))
P.append(panel(L, "timeseries", "Operator memory and CPU", "Each replica's resident memory and CPU.",
    [target("ferrotrain_operator_process_resident_memory_bytes", "{{pod}} memory"),
     target("rate(ferrotrain_operator_process_cpu_seconds[5m])", "{{pod}} CPU")], w=8))
fleet = dashboard("ferrotrain-fleet", "ferrotrain / fleet",
    "Every DistributedTraining and the operator: jobs by phase, step rates, goodput, restarts by reason, time to recover, the network, refused connections, reconciles.",
    [var_ds(), var_query("namespace", "Namespace", "label_values(ferrotrain_operator_job_phase, namespace)", multi=True, include_all=True)], P)
fleet["templating"]["list"][1]["allValue"] = ".*"



def main():
    import os
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = os.path.join(root, "charts/ferrotrain/files/dashboards")
    files = {"ferrotrain-job.json": job, "ferrotrain-fleet.json": fleet}
    stale = []
    for name, board in files.items():
        text = json.dumps(board, indent=2) + "\n"
        path = os.path.join(out, name)
        if "--check" in sys.argv[1:]:
            current = open(path).read() if os.path.exists(path) else ""
            if current != text:
                stale.append(path)
        else:
            with open(path, "w") as f:
                f.write(text)
    if stale:
        sys.exit("stale (run scripts/gen-dashboards.py): " + ", ".join(stale))


main()
