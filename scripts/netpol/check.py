"""What the jobs' NetworkPolicies mean: network-config-analyzer (nca) computes who can reach
whom on which ports from the policies the operator renders, over the fixture of
scripts/netpol/ (cluster.yaml, jobs.yaml), and this script compares every pair of endpoints,
port range by port range, with the intended table below (docs/security-checks.md). Run by
scripts/netpol-check.sh with nca's venv (PyYAML comes with nca).

usage: check.py NCA WORKDIR CLUSTER_YAML RENDERED_YAML RENDERED_OPEN_YAML [--self-test]
RENDERED_YAML: jobs.yaml rendered with the operator's pods known (--pod-labels,
--pod-namespace); RENDERED_OPEN_YAML: rendered without them (the progress port open to all).
Exit status 0: nca agrees with the table; 1: a mismatch (in --self-test: every deliberately
broken policy was caught, the expected outcome); 2: the check itself failed (nca, its output,
the fixture, or in --self-test a broken policy that went unnoticed).
"""

import copy
import os
import re
import subprocess
import sys
import time

import yaml

JOBS = ("alpha", "beta", "gamma", "delta")
# The jobs with restrictEgress: gamma (egressTo), delta (its checkpoint store).
RESTRICTED = ("gamma", "delta")
JOB_LABEL = "ferrotrain.dev/job"
OPERATOR = ("ferrotrain-system", "operator")
PROMETHEUS = ("monitoring", "prometheus")
STORE = ("store", "minio")  # delta's checkpoint store, behind Service store/minio
# The whole IPv4 space as nca names it: any address that is not a pod of the fixture.
INTERNET = "0.0.0.0-255.255.255.255"
PORT_PROTOCOLS = ("TCP", "UDP", "SCTP")

started = time.monotonic()


def die(message):
    print(f"netpol-check: {message}", file=sys.stderr)
    sys.exit(2)


# --- connection sets: "all", or {protocol: sorted disjoint port intervals} ----------------
ALL = "all"


def ports(*spec):
    """ports(9090, (41000, 42999)) -> [(9090, 9090), (41000, 42999)], merged."""
    return merge([(p, p) if isinstance(p, int) else p for p in spec])


def merge(intervals):
    out = []
    for lo, hi in sorted(intervals):
        if out and lo <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def conns(**by_protocol):
    return {p: ports(*spec) for p, spec in by_protocol.items() if spec}


def union(a, b):
    if a == ALL or b == ALL:
        return ALL
    out = dict(a)
    for p, iv in b.items():
        out[p] = merge(out.get(p, []) + iv)
    return out


def intersect(a, b):
    if a == ALL:
        return b
    if b == ALL:
        return a
    out = {}
    for p in a.keys() & b.keys():
        iv = [(max(x[0], y[0]), min(x[1], y[1])) for x in a[p] for y in b[p]]
        iv = merge([i for i in iv if i[0] <= i[1]])
        if iv:
            out[p] = iv
    return out


def allows(c, protocol, port):
    return c == ALL or any(lo <= port <= hi for lo, hi in c.get(protocol, []))


def show(c):
    if c == ALL:
        return "all"
    if not c:
        return "none"
    return "; ".join(
        f"{p} " + ",".join(str(lo) if lo == hi else f"{lo}-{hi}" for lo, hi in c[p]) for p in sorted(c)
    )


NONE = {}
GANG = conns(TCP=[29500, 9090, (41000, 42999)])  # rendezvous, progress, portRange
PROGRESS = conns(TCP=[9090])
DNS = conns(TCP=[53], UDP=[53])
OBJECT_STORE = conns(TCP=[443])  # gamma's egressTo: namespace other, TCP 443
STORE_PORT = conns(TCP=[9000])  # delta's store: the Service's port 80 leads to its pods' 9000


# --- the fixture ---------------------------------------------------------------------------
class Endpoint:
    def __init__(self, namespace, name, labels):
        self.namespace, self.name, self.labels = namespace, name, labels or {}

    @property
    def id(self):
        return f"{self.namespace}/{self.name}" if self.namespace else self.name

    @property
    def job(self):
        """The job whose label the pod carries (the impostor copies alpha's)."""
        job = self.labels.get(JOB_LABEL)
        return job if self.namespace == "ml" and job in JOBS else None

    @property
    def role(self):
        """The row of the table: a job's pods are one role, each other pod its own."""
        if self.name == INTERNET:
            return "0.0.0.0/0 (outside)"
        if self.job and self.name.startswith(self.job + "-"):
            return f"{self.job} pods"
        return self.id


def load(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d]


def endpoints(*docs):
    eps = [Endpoint(None, INTERNET, {})]
    for d in docs:
        if d.get("kind") == "Pod":
            m = d["metadata"]
            eps.append(Endpoint(m.get("namespace"), m["name"], m.get("labels")))
    return {e.id: e for e in eps}


# --- what the policies are meant to allow (docs/security-checks.md) --------------------------------
def expected(src, dst, operator_known):
    """The connections from src to dst that the jobs' policies are meant to let through."""
    # Ingress: a job's pods take only what its policy admits; every other pod takes anything.
    if dst.job:
        if src.job == dst.job:
            inbound = GANG  # the gang (and whoever copies its label: the impostor)
        elif not operator_known:
            inbound = PROGRESS  # the operator's pods unknown: the progress port open to all
        elif (src.namespace, src.name) == OPERATOR:
            inbound = PROGRESS
        elif dst.job == "beta" and (src.namespace, src.name) == PROMETHEUS:
            inbound = PROGRESS  # beta's metricsFrom
        else:
            inbound = NONE
    else:
        inbound = ALL
    # Egress: open, except gamma's and delta's (restrictEgress): their gang, DNS anywhere, and
    # gamma's egressTo, delta's checkpoint store (the pods its Service selects, on their port).
    if src.job in RESTRICTED:
        outbound = union(DNS, GANG if dst.job == src.job else NONE)
        if src.job == "gamma" and dst.namespace == "other":
            outbound = union(outbound, OBJECT_STORE)
        if src.job == "delta" and (dst.namespace, dst.name) == STORE:
            outbound = union(outbound, STORE_PORT)
    else:
        outbound = ALL
    return intersect(inbound, outbound)


# --- nca ------------------------------------------------------------------------------------
def run_nca(nca, workdir, name, cluster, rendered_docs):
    """nca's connectivity map of the fixture: {(src id, dst id): connections}."""
    # Relative names in WORKDIR, nca's working directory: its messages name the files so.
    policies = f"{name}.yaml"
    with open(os.path.join(workdir, policies), "w") as f:
        yaml.safe_dump_all([d for d in rendered_docs if d.get("kind") in ("NetworkPolicy", "Pod")], f)
    out = f"{name}.connectivity.txt"
    if os.path.exists(os.path.join(workdir, out)):
        die(f"{out} exists: nca would append to it")
    # Only files: nca reads a live cluster through kubectl when given no resources, so keep
    # kubectl out of its reach as well.
    env = {"PATH": os.path.dirname(nca), "HOME": workdir, "KUBECONFIG": os.path.join(workdir, "none")}
    t0 = time.monotonic()
    r = subprocess.run(
        [nca, "--connectivity", "--resource_list", cluster, "--resource_list", policies,
         "--output_endpoints", "pods", "--output_format", "txt_no_fw_rules", "--file_out", out],
        cwd=workdir, env=env, capture_output=True, text=True,
    )
    elapsed = time.monotonic() - t0
    log = (r.stdout + r.stderr).strip().splitlines()
    if r.returncode != 0 or not os.path.exists(os.path.join(workdir, out)):
        die(f"nca failed ({name}, exit {r.returncode}):\n" + "\n".join(log))
    noise = ("global: cluster has", "wrote query output to", "Total run time")
    for line in log:
        if line.strip() and not line.startswith(noise):
            print(f"  nca ({name}): {line}")
    result = {}
    with open(os.path.join(workdir, out)) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            m = re.fullmatch(r"(\S+) => (\S+) : (.+)", line)
            if not m:
                die(f"nca ({name}): cannot read the line {line!r}")
            key = (m[1], m[2])
            result[key] = union(result.get(key, NONE), parse_conns(m[3], name))
    return result, elapsed


def parse_conns(text, name):
    """nca's connection string: 'All connections', or cubes like
    {protocols:TCP, UDP,dst_ports:53,9090-9091}. Anything else is refused: the check must not
    read a form it does not understand as 'no connection'."""
    if text == "All connections":
        return ALL
    if text == "No connections":
        return NONE
    cubes = re.findall(r"\{[^{}]*\}", text)
    if not cubes or ",".join(cubes) != text:
        die(f"nca ({name}): connection form not understood: {text!r}")
    out = NONE
    for cube in cubes:
        items = re.split(r",(?=[a-z_]+:)", cube[1:-1])
        if not all(":" in item for item in items):
            die(f"nca ({name}): connection form not understood: {cube!r}")
        fields = dict(item.split(":", 1) for item in items)
        if set(fields) - {"protocols", "dst_ports"} or "protocols" not in fields:
            die(f"nca ({name}): connection form not understood: {cube!r}")
        protocols = [p.strip() for p in fields["protocols"].split(",")]
        if any(p not in PORT_PROTOCOLS for p in protocols):
            die(f"nca ({name}): protocols not understood: {cube!r}")
        if "dst_ports" in fields:
            iv = []
            for part in fields["dst_ports"].split(","):
                lo, _, hi = part.partition("-")
                iv.append((int(lo), int(hi or lo)))
        else:
            iv = [(1, 65535)]
        out = union(out, {p: merge(iv) for p in protocols})
    return out


# --- comparing ------------------------------------------------------------------------------
def compare(eps, actual, operator_known, name):
    """[(src, dst, expected, actual)] for every ordered pair of distinct endpoints."""
    unknown = {x for pair in actual for x in pair} - eps.keys()
    if unknown:
        die(f"nca ({name}) names endpoints the fixture does not have: {sorted(unknown)}")
    cells = []
    for src in eps.values():
        for dst in eps.values():
            if src is dst or (src.name == INTERNET and dst.name == INTERNET):
                continue
            want = expected(src, dst, operator_known)
            got = actual.get((src.id, dst.id), NONE)
            cells.append((src, dst, want, got))
    return cells


def mismatches(cells):
    return [c for c in cells if show(c[2]) != show(c[3])]


def table(cells):
    """Who reaches each job's pods, grouped by outcome; where gamma's and delta's pods reach
    (their egress is restricted); the pairs no policy touches folded into one line."""
    ingress, egress, folded = {}, {}, 0
    for src, dst, want, got in cells:
        if dst.job:
            same = src.role == dst.role
            group, key, member = ingress, (dst.role, show(want), show(got)), \
                f"{src.role} (each other)" if same else src.role
        elif src.job in RESTRICTED:
            group, key, member = egress, (src.role, show(want), show(got)), dst.role
        else:
            if show(want) == show(got) == "all":
                folded += 1
                continue
            group, key, member = egress, (src.role, show(want), show(got)), dst.role
        group.setdefault(key, [])
        if member not in group[key]:
            group[key].append(member)
    order = lambda kv: (kv[0][0], kv[0][1] == "none", kv[0][1])
    rows = [("TO", "EXPECTED", "NCA", "", "FROM")]
    rows += [(d, w, g, "ok" if w == g else "MISMATCH", ", ".join(m)) for (d, w, g), m in sorted(ingress.items(), key=order)]
    rows += [("", "", "", "", "")]
    rows += [("FROM", "EXPECTED", "NCA", "", "TO")]
    rows += [(s_, w, g, "ok" if w == g else "MISMATCH", ", ".join(m)) for (s_, w, g), m in sorted(egress.items(), key=order)]
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for r in rows:
        print(("  " + "  ".join(x.ljust(w) for x, w in zip(r, widths)) + "  " + r[4]).rstrip())
    print(f"  + {folded} pairs that no policy restricts (neither a job's pod the destination nor "
          "gamma's or delta's the source): all connections, as expected")


def probes(cells):
    """The ports named in issue 26, spelled out: which of them each peer reaches on alpha."""
    by_pair = {(s.id, d.id): (w, g) for s, d, w, g in cells}
    probe_ports = (22, 8080, 9090, 29500, 40999, 41000, 42999, 43000)
    peers = ["ml/alpha-0-1", "ml/beta-0-0", "ml/stranger", "ml/impostor", "ferrotrain-system/operator",
             "other/outsider"]
    widths = [max(4, len(str(p))) for p in probe_ports]
    print("  TCP ports of ml/alpha-0-0 that each peer reaches (nca; * where the table disagrees):")
    print(f"  {'FROM':<28} " + " ".join(str(p).ljust(w) for p, w in zip(probe_ports, widths)))
    for peer in peers:
        want, got = by_pair[(peer, "ml/alpha-0-0")]
        marks = []
        for p, w in zip(probe_ports, widths):
            mark = "open" if allows(got, "TCP", p) else "-"
            if allows(got, "TCP", p) != allows(want, "TCP", p):
                mark += "*"
            marks.append(mark.ljust(w))
        print(f"  {peer:<28} " + " ".join(marks).rstrip())


# --- self-test: policies broken on purpose must be caught ------------------------------------
def alpha_policy(docs):
    return next(d for d in docs if d["kind"] == "NetworkPolicy" and d["metadata"]["name"] == "alpha")


def empty_gang_selector(docs):
    alpha_policy(docs)["spec"]["ingress"][0]["from"][0]["podSelector"] = {}


def split_operator_peer(docs):
    peer = alpha_policy(docs)["spec"]["ingress"][1]["from"][0]
    alpha_policy(docs)["spec"]["ingress"][1]["from"][0:1] = [
        {"namespaceSelector": peer["namespaceSelector"]}, {"podSelector": peer["podSelector"]}]


def drop_end_port(docs):
    for port in alpha_policy(docs)["spec"]["ingress"][0]["ports"]:
        port.pop("endPort", None)


def widen_store_rule(docs):
    policy = next(d for d in docs if d["kind"] == "NetworkPolicy" and d["metadata"]["name"] == "delta")
    policy["spec"]["egress"][2]["to"][0].pop("podSelector")


BREAKAGES = [
    ("alpha's gang rule with its podSelector emptied (any pod of the namespace)", empty_gang_selector,
     ("ml/stranger", "ml/alpha-0-0")),
    ("alpha's operator peer split in two (its namespace OR its labels)", split_operator_peer,
     ("ml/fake-operator", "ml/alpha-0-0")),
    ("alpha's port range without its endPort (41000 alone)", drop_end_port,
     ("ml/alpha-0-1", "ml/alpha-0-0")),
    ("delta's store rule without its podSelector (the store's whole namespace)", widen_store_rule,
     ("ml/delta-0-0", "store/console")),
]


def main():
    args = sys.argv[1:]
    self_test = "--self-test" in args
    args = [a for a in args if a != "--self-test"]
    nca, workdir, cluster_path, rendered, rendered_open = args
    cluster_docs = load(cluster_path)
    cluster = "cluster.yaml"
    with open(os.path.join(workdir, cluster), "w") as f:
        yaml.safe_dump_all(cluster_docs, f)
    docs = load(rendered)
    docs_open = load(rendered_open)
    for d in (docs, docs_open):
        names = sorted(x["metadata"]["name"] for x in d if x["kind"] == "NetworkPolicy")
        if names != sorted(JOBS):
            die(f"the rendering holds the NetworkPolicies {names}, not one per job {sorted(JOBS)}")
    eps = endpoints(*cluster_docs, *docs)
    nca_seconds = 0.0

    if self_test:
        missed = []
        for n, (what, breakage, pair) in enumerate(BREAKAGES, 1):
            broken = copy.deepcopy(docs)
            breakage(broken)
            actual, elapsed = run_nca(nca, workdir, f"broken-{n}", cluster, broken)
            nca_seconds += elapsed
            found = mismatches(compare(eps, actual, True, f"broken-{n}"))
            named = [c for c in found if (c[0].id, c[1].id) == pair]
            print(f"self-test: {what}: {len(found)} pair(s) differ; "
                  + (f"{pair[0]} -> {pair[1]}: expected {show(named[0][2])}, nca says {show(named[0][3])}"
                     if named else f"NOT CAUGHT: {pair[0]} -> {pair[1]} is not among them"))
            caught = bool(named)
            if not caught:
                missed.append(what)
        print(f"netpol-check: {time.monotonic() - started:.1f} s (nca {nca_seconds:.1f} s)")
        if missed:
            die(f"self-test: broken policies went unnoticed ({'; '.join(missed)}): the check cannot fail")
        print("self-test: every broken policy was caught and the check exits 1, as it must")
        sys.exit(1)

    failed = []
    for name, rendering, operator_known, title in [
        ("operator-known", docs, True,
         "jobs rendered with the operator's pods known (--pod-labels, --pod-namespace), as in the chart"),
        ("operator-unknown", docs_open, False,
         "jobs rendered without them (an operator outside the cluster): progress open to all"),
    ]:
        actual, elapsed = run_nca(nca, workdir, name, cluster, rendering)
        nca_seconds += elapsed
        cells = compare(eps, actual, operator_known, name)
        print(f"\n{title}: {len(cells)} ordered pairs of {len(eps)} endpoints, every port compared")
        table(cells)
        if operator_known:
            print()
            probes(cells)
        for s, d, want, got in mismatches(cells):
            failed.append(f"{name}: {s.id} -> {d.id}: expected {show(want)}, nca says {show(got)}")

    print(f"\nnetpol-check: {time.monotonic() - started:.1f} s (nca {nca_seconds:.1f} s)")
    if failed:
        print(f"FAILED: {len(failed)} pair(s) where the policies do not mean what docs/security-checks.md says:")
        for f in failed:
            print(f"  {f}")
        sys.exit(1)
    print("netpol-check: every pair as intended")


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # a crash must not read as exit 1, "a mismatch" (or a passed self-test)
        import traceback
        traceback.print_exc()
        die(f"internal error: {e!r}")
