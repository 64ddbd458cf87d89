"""The circuit graph view (offline HTML/SVG, rendered and hovered in headless Chromium), the
route into a head, ``pe-interp circuit`` end to end, and the agreement measures."""

from __future__ import annotations

import json
import re
import time

import numpy as np
import pytest
import torch
from browser_env import LOCAL_SCHEMES, DevTools, chromium_binary, is_flat

from pe_interp.cli import main
from probes import Circuit, attribute, circuit, path_patch
from probes.circuits import exact_edges, family_attributions
from probes.circuits.agreement import spearman, top_k
from probes.circuits.route import HeadRoute, head_route
from probes.circuits.view import circuit_html, circuit_page, layout


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    import pe_interp

    out = tmp_path_factory.mktemp("runs") / "rope"
    torch.manual_seed(0)
    pe_interp.train(
        task="distance",
        encoding="rope",
        preset="smoke",
        out=out,
        progress=False,
        epochs=12,
        lr=5e-3,
    )
    return out


@pytest.fixture(scope="module")
def loaded(smoke_run):
    from pe_interp import load_run

    return load_run(smoke_run)


def test_layout_puts_nodes_in_rows_by_layer():
    nodes = ["embed", "L0H1", "L0H0", "MLP0", "L1H3", "logits"]
    xy = layout(nodes, 2, 800, 400)
    ys = {n: xy[n][1] for n in nodes}
    assert (
        ys["embed"] > ys["L0H0"] == ys["L0H1"] > ys["MLP0"] > ys["L1H3"] > ys["logits"]
    )  # bottom to top
    assert xy["L0H0"][0] < xy["L0H1"][0]  # head order along the row


def test_svg_has_one_path_per_edge_coloured_by_share(loaded):
    fams = family_attributions(loaded.model, loaded.task, 16, seed=1)
    c = circuit(fams, top_n=12)
    frag = circuit_html(c, title="t")
    paths = re.findall(
        r"<path class='edge'[^>]*stroke='rgb\((\d+),(\d+),(\d+)\)'[^>]*data-tip='([^']*)'", frag
    )
    assert len(paths) == len(c.edges) > 6
    share = dict(zip([f"{w} -&gt; {r}" for w, r in c.edges], c.share()))
    for _, _, b, tip in paths:
        s = share[tip.split("\n")[0]]
        assert abs((int(b) - 1) / (172 - 1) - s) < 0.02 or np.isnan(
            s
        )  # blue channel runs 1 (content) .. 172 (position)
        assert re.search(r"position: [+-]\d\.\d{4}", tip) and "content:" in tip
    assert "http" not in frag.replace("http://www.w3.org/2000/svg", "")  # offline
    one = circuit(fams["position"], top_n=5, select="top")
    single = circuit_html(one)
    assert single.count("<path class='edge'") == 5 and "positive" in single


def test_position_aware_circuit_draws_one_dashed_path_per_span(loaded):
    from probes.circuits.view import DASHES

    fams = family_attributions(loaded.model, loaded.task, 16, seed=1, positional=True)
    c = circuit(fams, top_n=25, positional=True)
    frag = circuit_html(c, title="spans")
    paths = re.findall(
        r"<path class='edge'[^>]*?(?: stroke-dasharray='([^']*)')? data-tip='([^']*)'", frag
    )
    assert len(paths) == len(c.edges) and len(set(c.spans)) > 1
    for dash, tip in paths:
        span = tip.split("\n")[0].rsplit(" @ ", 1)[1]
        assert dash == DASHES[c.span_names.index(span) % len(DASHES)]
    for name in set(c.spans):
        assert f"</svg>{name} " in frag  # the legend names each span drawn


def test_route_into_a_head_is_exact_path_patching(loaded):
    model, task = loaded.model, loaded.task
    fams = family_attributions(model, task, 16, seed=2)
    route = head_route(model, task, (1, 2), n=16, seed=2, attributions=fams)
    pairs = task.counterfactuals(16, kind="position", seed=2)
    pp = path_patch(model, pairs, None, ["embed", "L0H3", "MLP0"], ["L1H2"], "k", metric="margin")
    for i, s in enumerate(pp.senders):
        assert route.exact["position"]["k"][s] == pytest.approx(
            pp.effects[i, 0], rel=1e-9, abs=1e-12
        )
    assert route.estimate["content"]["v"]["L0H0"] == fams["content"].edge("L0H0", "L1H2.v")
    assert route.layer0 is None and set(route.exact["content"]["q"]) == {
        "embed",
        *[f"L0H{h}" for h in range(4)],
        "MLP0",
    }
    r0 = head_route(model, task, "L0H1", n=16, seed=2)
    assert set(r0.exact["position"]["q"]) == {"embed"}
    shares = r0.layer0["variance_share"]
    assert {"content-content", "offset"} <= set(shares) and all(
        0 <= v <= 1.5 for v in shares.values()
    )
    assert len(r0.layer0["rope_frequency_share"]) == model.cfg.d_head // 2
    assert HeadRoute.from_dict(json.loads(json.dumps(r0.to_dict()))).exact == r0.exact


def test_exact_edges_fill_every_edge(loaded):
    model, task = loaded.model, loaded.task
    pairs = task.counterfactuals(8, kind="position", seed=3)
    ex = exact_edges(model, pairs)
    est = attribute(model, pairs, granularity="edge", metric="margin")
    assert np.array_equal(np.isnan(ex.scores), np.isnan(est.scores))
    pp = path_patch(model, pairs, None, ["L0H2"], ["L1H0"], "v", metric="margin")
    assert ex.edge("L0H2", "L1H0.v") == pytest.approx(pp.effects[0, 0], rel=1e-12)


def test_agreement_measures():
    a, b = np.array([1.0, 2, 3, 4, 5]), np.array([2.0, 1, 4, 3, 9])
    n = len(a)
    d = np.argsort(np.argsort(a)) - np.argsort(np.argsort(b))
    assert spearman(a, b) == pytest.approx(1 - 6 * (d**2).sum() / (n * (n * n - 1)))
    assert spearman(a, -a) == pytest.approx(-1.0)
    assert top_k(a, b, 1) == 1.0 and top_k(a, b, 2) == 0.5 and top_k(a, -b, 2) == 0.0
    assert np.isnan(spearman([1, np.nan], [2, 3]))


def test_cli_writes_circuit_json_and_html(smoke_run, capsys, tmp_path):
    from probes.circuits import faithfulness_curve
    from probes.circuits.graph import build_graph
    from probes.circuits.paths import prune

    rc = main(
        [
            "circuit",
            str(smoke_run),
            "--n",
            "16",
            "--top-n",
            "10",
            "--method",
            "atp",
            "--counterfactual",
            "position",
        ]
    )
    assert rc == 0
    c = Circuit.load(smoke_run / "circuit.json")
    printed, err = capsys.readouterr()  # the phases go to stderr
    # the printed edges say whether they enter the top head
    into = c.into(c.meta["top_head"])
    heading = (
        f"edges of the circuit into {c.meta['top_head']}:"
        if into
        else f"no edge of the circuit enters {c.meta['top_head']}"
    )
    assert heading in printed and "kept per span:" in printed
    # each phase on stderr, the edge scores with a bar of the pairs
    assert "edge scores (atp) on 16 pairs of position, content" in err
    for kind in ("position", "content"):
        assert f"{kind} pairs (atp): 100%" in err and "16/16 [" in err
    assert 0 < len(c.edges) <= 10 and c.positional and set(c.scores) == {"position", "content"}
    graph = build_graph(loaded_model(smoke_run).cfg)
    keep = c.keep_mask(graph)
    assert np.array_equal(prune(graph, keep), keep)  # connected
    assert c.meta["top_head"] and c.meta["route"]["exact"]["position"]["q"]
    curve = c.faithfulness
    assert curve["sizes"][0] == 0 and curve["recovered"][0] == pytest.approx(0.0, abs=1e-9)
    run = loaded_model(smoke_run, whole=True)
    held_out = run.task.counterfactuals(16, kind="position", seed=1)
    again = faithfulness_curve(run.model, c, held_out, spans=run.task)
    assert again["recovered"][0] == pytest.approx(
        curve["kept"], rel=1e-9
    )  # the kept circuit's own faithfulness
    page = (smoke_run / "circuit.html").read_text()
    assert (
        page.count("<path class='edge'") == len(c.edges)
        and "Faithfulness" in page
        and " @ " in page
    )
    assert main(["circuit", str(smoke_run), "--top-n", "0"]) == 2  # a one-line error
    assert (
        main(["circuit", str(smoke_run), "--method", "atp*"]) == 2
    )  # atp* scores whole edges only
    assert main(["circuit", str(smoke_run), "--faithful", "1.5"]) == 2


def test_cli_faithful_keeps_the_smallest_circuit_that_reaches_it(smoke_run, capsys, tmp_path):
    rc = main(
        [
            "circuit",
            str(smoke_run),
            "--n",
            "16",
            "--method",
            "atp",
            "--faithful",
            "0.8",
            "--tolerance",
            "0",
            "--out",
            str(tmp_path),
        ]
    )
    assert rc == 0
    raw = json.loads((tmp_path / "circuit.json").read_text())
    assert {"edges", "spans", "total_edges", "faithfulness"} <= set(raw)
    f = raw["faithfulness"]
    assert (
        f["kept"] >= 0.8
        and f["target"] == 0.8
        and f["size"] == len(raw["edges"]) < raw["total_edges"]
    )
    shorter = f["sizes"].index(f["prefix"] - 1)
    assert f["recovered"][shorter] < 0.8  # one unit less does not reach it
    out = capsys.readouterr().out
    assert (
        f"the smallest circuit with faithfulness >= 0.8: {len(raw['edges'])} of {raw['total_edges']}"
        in out
    )
    whole = main(
        [
            "circuit",
            str(smoke_run),
            "--n",
            "16",
            "--method",
            "atp*",
            "--whole-edges",
            "--faithful",
            "0.8",
            "--out",
            str(tmp_path / "w"),
        ]
    )
    assert whole == 0 and Circuit.load(tmp_path / "w" / "circuit.json").spans is None
    f = Circuit.load(tmp_path / "w" / "circuit.json").faithfulness  # the default: 2% apart
    below = [n for n, r in zip(f["sizes"], f["recovered"]) if n < f["prefix"] and r < 0.8]
    assert f["tolerance"] == 0.02 and f["prefix"] - max(below) <= max(1, 0.02 * f["prefix"])
    assert f["kept"] >= 0.8 and f["forwards"] == len(f["sizes"])


def test_cli_learned_ranks_by_learnt_masks_and_keeps_family_scores(smoke_run, capsys, tmp_path):
    rc = main(
        [
            "circuit",
            str(smoke_run),
            "--n",
            "16",
            "--method",
            "learned",
            "--sparsity",
            "0.3",
            "--faithful",
            "0.8",
            "--out",
            str(tmp_path),
        ]
    )
    assert rc == 0
    c = Circuit.load(tmp_path / "circuit.json")
    f, L = c.faithfulness, c.meta["learned"]
    assert c.method == "learned" and set(c.scores) == {"position", "content"} and c.positional
    assert f["kept"] >= 0.8 and f["size"] == len(c.edges) < c.total_edges
    assert 0 < L["size"] <= c.total_edges and L["sparsity"] == 0.3 and "history" not in L
    assert (
        main(["circuit", str(smoke_run), "--method", "learned", "--sparsity", "-1"]) == 2
    )  # a one-line error
    assert main(["circuit", str(smoke_run), "--method", "learned", "--budget", "1.5"]) == 2
    assert main(["circuit", str(smoke_run), "--budget", "0.1"]) == 2  # eap-ig has no budget
    rc = main(
        [
            "circuit",
            str(smoke_run),
            "--n",
            "16",
            "--method",
            "learned",
            "--budget",
            "0.25",
            "--top-n",
            "5",
            "--out",
            str(tmp_path / "b"),
        ]
    )
    L = Circuit.load(tmp_path / "b" / "circuit.json").meta["learned"]
    assert (
        rc == 0
        and L["budget"] == 0.25
        and "sparsity" not in L
        and L["size"] == round(0.25 * c.total_edges)
    )


def loaded_model(path, whole: bool = False):
    from pe_interp import load_run

    run = load_run(path)
    return run if whole else run.model


def hover_check(path) -> dict:
    """Load ``path`` in headless Chromium, hover each circuit's first edge, and return errors,
    non-local requests, the tooltip text, the SVG's size and a screenshot."""
    dt = DevTools(chromium_binary())
    try:
        sid = dt.open(path)
        expr = """(() => { const root = document.querySelector('.pe-circuit');
            const edge = root.querySelector('path.edge'); const box = root.querySelector('svg').getBoundingClientRect();
            edge.dispatchEvent(new MouseEvent('mouseover', {bubbles: true, clientX: 50, clientY: 60}));
            const tip = root.querySelector('.tip');
            return {tip: tip.textContent, shown: getComputedStyle(tip).display, width: box.width, height: box.height,
                    edges: root.querySelectorAll('path.edge').length}; })()"""
        value = dt.call(
            "Runtime.evaluate", {"expression": expr, "returnByValue": True}, session=sid
        )["result"]["value"]
        time.sleep(0.3)
        shot = dt.call("Page.captureScreenshot", {"format": "png"}, session=sid)
        errors, external = [], []
        for e in dt.events:
            m, p = e.get("method"), e.get("params", {})
            if m == "Runtime.exceptionThrown" or (
                m == "Runtime.consoleAPICalled" and p.get("type") == "error"
            ):
                errors.append(str(p)[:300])
            elif m == "Network.requestWillBeSent" and not p["request"]["url"].startswith(
                LOCAL_SCHEMES
            ):
                external.append(p["request"]["url"])
        import base64

        return {
            **value,
            "errors": errors,
            "external": external,
            "screenshot": base64.b64decode(shot["data"]),
        }
    finally:
        dt.close()


def test_graph_renders_and_hovers_in_chromium(loaded, tmp_path):
    fams = family_attributions(loaded.model, loaded.task, 16, seed=1)
    c = circuit(fams, top_n=15, select="top")
    page = tmp_path / "circuit.html"
    page.write_text(circuit_page(c, title="smoke", highlight=c.nodes[1]))
    res = hover_check(page)
    assert res["errors"] == [] and res["external"] == []
    assert res["edges"] == 15 and res["width"] > 500 and res["height"] > 300
    assert res["shown"] == "block"
    first = int(
        np.argmin(np.abs(c.scores["position"]) + np.abs(c.scores["content"]))
    )  # drawn first
    w, r = c.edges[first]
    assert (
        res["tip"].startswith(f"{w} -> {r}") and f"{c.scores['position'][first]:+.4f}" in res["tip"]
    )
    assert not is_flat(res["screenshot"])


def test_report_section_shows_each_runs_circuit(loaded, tmp_path):
    from types import SimpleNamespace

    from pe_interp.report.circuit import circuits_section

    fams = family_attributions(loaded.model, loaded.task, 16, seed=1)
    c = circuit(fams, top_n=6, select="top")
    c = type(c)(
        **{
            **c.__dict__,
            "meta": {
                **c.meta,
                "top_head": "L0H1",
                "route": {"exact": {"position": {"q": {"embed": 0.25}}}},
            },
        }
    )
    runs = []
    for i, label in enumerate(("rope", "rope", "t5")):
        d = tmp_path / f"r{i}"
        d.mkdir()
        if label == "rope":
            c.save(d / "circuit.json")
        runs.append(SimpleNamespace(label=label, task="distance", seed=i, run_dir=d))
    out = circuits_section(runs)
    assert (
        out.count("<svg") == 1 and out.count("<path class='edge'") == 6
    )  # the lowest seed only; t5 has none
    assert "embed → q (+0.250)" in out
    assert "pe-interp circuit" in circuits_section(runs[2:])
    page = tmp_path / "section.html"
    page.write_text(f"<!DOCTYPE html><html><body>{out}</body></html>")
    res = hover_check(page)
    assert res["errors"] == [] and res["external"] == [] and res["shown"] == "block"
