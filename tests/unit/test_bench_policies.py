"""``dspark-dynamic-bench --policies``: spec parsing, rotation, paired ratios, and whole runs
against a fake OpenAI-compatible streaming server that records what each request asked for."""

from __future__ import annotations

import io
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from dspark_dynamic.tools import bench_client as bc
from dspark_dynamic.tools import bench_policies as bp
from dspark_dynamic.tools import live_check
from dspark_dynamic.tools.paired import rotation

# --- specs ---------------------------------------------------------------------------------

@pytest.mark.parametrize("text, label, xargs", [
    ("depth 0", "fixed 0", {"dspark_dynamic_policy": "fixed", "dspark_dynamic_depth": 0}),
    ("fixed 2", "fixed 2", {"dspark_dynamic_policy": "fixed", "dspark_dynamic_depth": 2}),
    ("  Fixed   12 ", "fixed 12", {"dspark_dynamic_policy": "fixed", "dspark_dynamic_depth": 12}),
    ("phase 1/2", "phase 1/2", {"dspark_dynamic_policy": "phase", "dspark_dynamic_reasoning_depth": 1,
                                "dspark_dynamic_answer_depth": 2}),
    ("adaptive", "adaptive", {"dspark_dynamic_policy": "adaptive"}),
    ("vllm-av", "vllm-av", {"dspark_dynamic_policy": "vllm-av"}),
    ("server", "server", None),
])
def test_specs_map_to_labels_and_vllm_xargs(text, label, xargs):
    spec = bp.parse_spec(text)
    assert spec.label == label
    assert spec.xargs() == xargs
    if xargs is not None:
        assert all(isinstance(v, (str, int)) for v in xargs.values())  # flat values only


def test_depth_is_an_alias_of_fixed():
    assert bp.parse_spec("depth 3") == bp.parse_spec("fixed 3")
    with pytest.raises(AttributeError):
        bp.parse_spec("fixed 3").depth = 4  # frozen


@pytest.mark.parametrize("text", ["", "fixed", "depth", "phase", "fixed -1", "fixed two", "fixed 1.5",
                                  "phase 1", "phase 1/x", "phase /2", "depth 1 2", "two words", "1abc", "a=b"])
def test_bad_specs_are_one_line_errors_naming_them(text):
    with pytest.raises(bc.BenchError) as err:
        bp.parse_spec(text)
    message = str(err.value)
    assert "\n" not in message and repr(text.strip()) in message


def test_arms_reference_and_aa_pair():
    arms, ref, aa = bp.build_arms("depth 0,fixed 2,phase 1/2,adaptive")
    assert [a.label for a in arms] == ["fixed 0", "fixed 2", "phase 1/2", "adaptive", "fixed 0 (A/A)"]
    assert (ref, aa) == ("fixed 0", "fixed 0 (A/A)")
    assert arms[-1].spec.xargs() == arms[0].spec.xargs()

    arms, ref, aa = bp.build_arms("depth 0,adaptive", reference="fixed 2", aa="adaptive")
    assert [a.label for a in arms] == ["fixed 0", "adaptive", "fixed 2", "adaptive (A/A)"]  # the reference added
    assert (ref, aa) == ("fixed 2", "adaptive (A/A)")

    arms, ref, aa = bp.build_arms("fixed 1,server", with_aa=False)
    assert [a.label for a in arms] == ["fixed 1", "server"] and aa is None


@pytest.mark.parametrize("policies, message", [("fixed 2,depth 2", "listed twice"), ("fixed 2,,adaptive", "empty"),
                                               ("fixed 2,phase x", "'phase x'")])
def test_bad_policy_lists(policies, message):
    with pytest.raises(bc.BenchError, match=message):
        bp.build_arms(policies)


def test_rotation_of_arms_starts_round_r_at_arm_r_mod_n():
    arms, _, _ = bp.build_arms("fixed 0,fixed 2,adaptive")  # 4 arms with the A/A copy
    orders = [[a.label for a in rotation(arms, r)] for r in range(5)]
    assert orders[1] == ["fixed 2", "adaptive", "fixed 0 (A/A)", "fixed 0"]
    assert orders[4] == orders[0]
    for slot in range(4):
        assert {o[slot] for o in orders[:4]} == {a.label for a in arms}


# --- paired summaries over given numbers ----------------------------------------------------

def test_paired_ratio_and_iqr():
    s = bp.paired([110.0, 55.0, 120.0, 99.0, 104.0], [100.0, 50.0, 100.0, 90.0, 100.0])
    # ratios 1.1, 1.1, 1.2, 1.1, 1.04 -> sorted 1.04, 1.1, 1.1, 1.1, 1.2 (inclusive quartiles)
    assert (s.median, s.q1, s.q3, s.n) == pytest.approx((1.1, 1.1, 1.1, 5))
    s = bp.paired([1.0, 2.0, 3.0, 4.0], [1.0, 1.0, 1.0, 1.0])
    assert (s.median, s.q1, s.q3) == pytest.approx((2.5, 1.75, 3.25))
    s = bp.paired([2.0, None, 3.0], [1.0, 1.0, 0.0])  # a round missing on either side is left out
    assert (s.median, s.n) == (2.0, 1)
    assert bp.paired([None], [1.0]) is None


def test_per_round_pairs_rounds_by_number():
    rows = [row(0, "a", 1.0), row(2, "a", 3.0), row(0, "b", 2.0), row(1, "b", 4.0), row(2, "b", 6.0)]
    assert bp.per_round(rows, "a", "overall") == [1.0, None, 3.0]
    assert bp.paired(bp.per_round(rows, "a", "overall"), bp.per_round(rows, "b", "overall")).median == 0.5


def row(r, arm, tps, reasoning=None, answer=None):
    return {"round": r, "arm": arm, "tok_per_s": tps,
            "phases": {"reasoning": {"tok_per_s": reasoning}, "answer": {"tok_per_s": answer}}}


def test_summary_ratios_aa_band_and_phases():
    rows = []
    ref = [100.0, 80.0, 120.0, 90.0, 110.0]
    for r, base in enumerate(ref):
        rows += [row(r, "fixed 2", base, base / 2, base * 2),
                 row(r, "fixed 2 (A/A)", base * (1.01 if r % 2 else 0.99), None, base * 2),
                 row(r, "fixed 0", base * 0.8, base / 2 * 0.7, base * 2 * 0.9),
                 row(r, "adaptive", base * 1.005, None, None)]
    labels = ["fixed 2", "fixed 0", "adaptive", "fixed 2 (A/A)"]
    s = bp.summarize_rows(rows, labels, "fixed 2", "fixed 2 (A/A)")
    assert s["arms"]["fixed 2"]["overall"]["median"] == 100.0
    assert s["arms"]["fixed 2"]["reasoning"]["median"] == 50.0
    assert s["ratios"]["fixed 0"]["overall"]["median"] == pytest.approx(0.8)
    assert s["ratios"]["fixed 0"]["reasoning"]["median"] == pytest.approx(0.7)
    assert s["ratios"]["fixed 0"]["answer"]["median"] == pytest.approx(0.9)
    assert s["ratios"]["adaptive"]["reasoning"] is None
    assert set(s["ratios"]) == {"fixed 0", "adaptive"}  # neither the reference nor the A/A copy
    # A/A ratios: .99 1.01 .99 1.01 .99 -> median .99, IQR .99-1.01
    assert (s["aa"]["overall"]["median"], s["aa"]["overall"]["q1"], s["aa"]["overall"]["q3"]) == pytest.approx(
        (0.99, 0.99, 1.01))
    assert s["aa"]["answer"]["median"] == pytest.approx(1.0)
    assert s["ratios"]["fixed 0"]["beyond_aa"] is True
    assert s["ratios"]["adaptive"]["beyond_aa"] is False  # 1.005 lies inside the A/A band


def test_policy_acceptance_by_policy_and_phase():
    def s(name, value, **labels):
        return {(name, tuple(sorted(labels.items()))): value}

    before = {**s(bp.VERIFIED, 10, policy="fixed 2", phase="reasoning", engine="0"),
              **s(bp.ACCEPTED, 5, policy="fixed 2", phase="reasoning", engine="0")}
    after = {**s(bp.VERIFIED, 30, policy="fixed 2", phase="reasoning", engine="0"),
             **s(bp.VERIFIED, 8, policy="fixed 2", phase="reasoning", engine="1"),
             **s(bp.ACCEPTED, 19, policy="fixed 2", phase="reasoning", engine="0"),
             **s(bp.VERIFIED, 4, policy="phase 1/2", phase="answer", engine="0")}
    acc = bp.policy_acceptance(before, after)
    assert acc["fixed 2"]["reasoning"] == {"verified": 28, "accepted": 14, "acceptance": 0.5}
    assert acc["phase 1/2"]["answer"]["acceptance"] == 0.0
    assert bp.policy_acceptance({}, {("dspark_dynamic:steps_total", ()): 1.0}) is None
    assert bp.policy_acceptance(None, after) is None


# --- whole runs against a fake server -------------------------------------------------------

def sse(obj):
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def label_of(xargs, configured="adaptive"):
    """The policy label this fake server counts a request under (as the plugin names them)."""
    if xargs is None:
        return configured
    policy = xargs["dspark_dynamic_policy"]
    if policy == "fixed":
        return f"fixed {xargs['dspark_dynamic_depth']}"
    if policy == "phase":
        return f"phase {xargs['dspark_dynamic_reasoning_depth']}/{xargs['dspark_dynamic_answer_depth']}"
    return policy


class FakeServer:
    """Streams 3 reasoning and 2 answer tokens per request; records (prompt, vllm_xargs) in
    arrival order; 400 for a policy word other than its own; per-policy series on /metrics
    (4 verified, 2 accepted per request and phase).  ``delay(xargs)``: seconds per chunk."""

    def __init__(self, configured="adaptive", metrics=True, delay=lambda xargs: 0.0, extra=""):
        self.seen: list[tuple[str, dict | None]] = []
        self.counts: dict[str, int] = {}
        self.lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                if self.path == "/v1/models":
                    self.send_response(200)
                    self.end_headers()
                    self.wfile.write(b'{"data": [{"id": "m"}]}')
                elif self.path == "/metrics" and metrics:
                    self.send_response(200)
                    self.end_headers()
                    with fake.lock:
                        counts = dict(fake.counts)
                    lines = ["# TYPE dspark_dynamic:policy_verified_draft_tokens counter",
                             "# TYPE dspark_dynamic:policy_accepted_draft_tokens counter"]
                    for policy, n in counts.items():
                        for phase in ("reasoning", "answer"):
                            lab = f'{{policy="{policy}",phase="{phase}",engine="0"}}'
                            lines.append(f"dspark_dynamic:policy_verified_draft_tokens_total{lab} {4.0 * n}")
                            lines.append(f"dspark_dynamic:policy_accepted_draft_tokens_total{lab} {2.0 * n}")
                    self.wfile.write(("\n".join(lines) + "\n" + extra).encode())
                else:
                    self.send_response(404)
                    self.end_headers()

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                xargs = body.get("vllm_xargs")
                policy = (xargs or {}).get("dspark_dynamic_policy")
                if policy not in (None, "fixed", "phase", configured):
                    self.send_response(400)
                    self.end_headers()
                    self.wfile.write(json.dumps({"error": {"message": f"policy {policy!r} is not this "
                                                                      f"server's ({configured})"}}).encode())
                    return
                with fake.lock:
                    fake.seen.append((body["messages"][0]["content"], xargs, body.get("temperature")))
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                chunks = [{"reasoning": " r"}, {"reasoning": " r r"}, {"content": " a a"}]
                for delta, ids in zip(chunks, ([1], [2, 3], [4, 5]), strict=True):
                    time.sleep(delay(xargs))
                    self.wfile.write(sse({"choices": [{"index": 0, "delta": delta, "token_ids": ids}]}))
                    self.wfile.flush()
                self.wfile.write(sse({"choices": [], "usage": {"completion_tokens": 5}}))
                self.wfile.write(b"data: [DONE]\n\n")
                with fake.lock:
                    lab = label_of(xargs, configured)
                    fake.counts[lab] = fake.counts.get(lab, 0) + 1

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


def slow_depth0(xargs):
    return 0.01 if xargs and xargs.get("dspark_dynamic_depth") == 0 else 0.0


def test_paired_run_end_to_end(tmp_path, capsys):
    out = tmp_path / "run.json"
    with FakeServer(delay=slow_depth0) as fake:
        rc = bc.main(["--base-url", fake.url, "--policies", "depth 0,fixed 2,phase 1/2,adaptive", "--rounds", "3",
                      "--json", str(out)])
        seen = list(fake.seen)
    text = capsys.readouterr().out
    assert rc == 0
    res = json.loads(out.read_text())
    labels = ["fixed 0", "fixed 2", "phase 1/2", "adaptive", "fixed 0 (A/A)"]
    xargs = {a["label"]: a["vllm_xargs"] for a in res["arms"]}
    assert list(xargs) == labels and res["reference"] == "fixed 0" and res["aa"] == "fixed 0 (A/A)"
    assert xargs["fixed 0 (A/A)"] == xargs["fixed 0"] == {"dspark_dynamic_policy": "fixed", "dspark_dynamic_depth": 0}

    # what the server saw: per round, each arm in rotated order, each on the same prompts in order
    prompts = bc.DEFAULT_PROMPTS
    assert len(seen) == 3 * len(labels) * len(prompts)
    assert all(temperature == 0.0 for _, _, temperature in seen)  # greedy by default in this mode
    i = 0
    for r in range(3):
        expected = labels[r:] + labels[:r]
        assert res["order"][r] == expected
        for label in expected:
            block = seen[i:i + len(prompts)]
            assert [p for p, _, _ in block] == prompts
            assert all(x == xargs[label] for _, x, _ in block)
            i += len(prompts)

    assert len(res["rows"]) == 3 * len(labels)
    first = res["rows"][0]
    assert first["completion_tokens"] == 5 * len(prompts)
    assert first["phases"]["answer"]["tokens"] == 2 * len(prompts)
    assert first["tok_per_s"] == pytest.approx(first["completion_tokens"] / first["seconds"])
    s = res["summary"]
    assert set(s["ratios"]) == {"fixed 2", "phase 1/2", "adaptive"}
    assert s["ratios"]["fixed 2"]["overall"]["n"] == 3
    assert s["ratios"]["fixed 2"]["overall"]["median"] > 1.0  # depth 0 streams slowly on this server
    assert s["aa"]["overall"]["n"] == 3
    assert res["acceptance"]["fixed 0"]["reasoning"] == {"verified": 4.0 * 18, "accepted": 2.0 * 18,
                                                         "acceptance": 0.5}  # both arms of the A/A pair
    assert list(res["acceptance"]) == ["fixed 0", "fixed 2", "phase 1/2", "adaptive"]  # in arm order
    assert res["plain"] is None

    assert "ratio to fixed 0" in text and "a ratio whose IQR overlaps this band is no measured difference" in text
    assert "policies do not mix" not in text  # concurrency 1
    assert "phase 1/2" in text and "50.0%" in text


def test_unknown_policy_word_is_a_one_line_error(capsys):
    with FakeServer(configured="adaptive") as fake:
        rc = bc.main(["--base-url", fake.url, "--policies", "fixed 2,vllm-av", "--rounds", "2"])
    err = capsys.readouterr().err
    assert rc == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "vllm-av" in lines[0] and "HTTP 400" in lines[0] and "Traceback" not in err


def test_bad_spec_on_the_command_line_exits_2(capsys):
    assert bc.main(["--policies", "fixed 2,phase 3"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'phase 3'" in err


def test_policy_options_need_policies(capsys):
    assert bc.main(["--rounds", "3", "--mix"]) == 2
    assert "--rounds, --mix needs --policies" in capsys.readouterr().err


def test_mix_sends_all_arms_together_and_says_so(capsys):
    with FakeServer() as fake:
        rc = bc.main(["--base-url", fake.url, "--policies", "fixed 1,server", "--no-aa", "--rounds", "2", "--mix",
                      "--json", "-"])
        seen = list(fake.seen)
    res = json.loads(capsys.readouterr().out)
    assert rc == 0 and res["mix"] is True and "per-request" in res["rate"]
    assert [a["label"] for a in res["arms"]] == ["fixed 1", "server"] and res["summary"]["aa"] is None
    n = len(bc.DEFAULT_PROMPTS)
    for r in range(2):
        block = seen[r * 2 * n:(r + 1) * 2 * n]
        assert sorted(p for p, _, _ in block) == sorted(bc.DEFAULT_PROMPTS * 2)
        assert sum(x is None for _, x, _ in block) == n  # "server" sends no vllm_xargs
    assert {r["arm"] for r in res["rows"]} == {"fixed 1", "server"} and len(res["rows"]) == 4

    with FakeServer() as fake:
        assert bc.main(["--base-url", fake.url, "--policies", "fixed 1,fixed 2", "--rounds", "1", "--mix"]) == 0
    assert "policies share decode steps" in capsys.readouterr().out


def test_concurrency_header_and_plain_server(capsys, tmp_path):
    with FakeServer() as fake, FakeServer(metrics=False) as plain:
        rc = bc.main(["--base-url", fake.url, "--policies", "fixed 2,fixed 0", "--rounds", "2", "--concurrency", "2",
                      "--plain-url", plain.url, "--json", str(tmp_path / "r.json")])
        plain_seen = list(plain.seen)
    text = capsys.readouterr().out
    assert rc == 0
    assert "an arm's own requests share decode steps; policies do not mix" in text
    assert "unpaired (different servers)" in text and "only as good as the box is quiet" in text
    assert len(plain_seen) == 2 * len(bc.DEFAULT_PROMPTS) and all(x is None for _, x, _ in plain_seen)
    res = json.loads((tmp_path / "r.json").read_text())
    assert len(res["plain"]["rows"]) == 2
    assert set(res["plain"]["ratio_of_medians"]) == {"fixed 2", "fixed 0", "fixed 2 (A/A)"}
    ratio = res["plain"]["ratio_of_medians"]["fixed 0"]
    assert ratio == pytest.approx(res["summary"]["arms"]["fixed 0"]["overall"]["median"]
                                  / res["plain"]["tok_per_s"]["median"])


def test_missing_policy_series_is_one_note(capsys):
    with FakeServer(metrics=False) as fake:
        assert bc.main(["--base-url", fake.url, "--policies", "fixed 2,adaptive", "--rounds", "1"]) == 0
    out = capsys.readouterr().out
    assert [line for line in out.splitlines() if "acceptance" in line] == [
        "acceptance per policy not shown: no usable /metrics on the server"]


def test_progress_line_on_stderr_and_off_under_json_stdout(capsys):
    with FakeServer() as fake:
        assert bc.main(["--base-url", fake.url, "--policies", "fixed 2,adaptive", "--rounds", "2", "--progress"]) == 0
        err = capsys.readouterr().err
        assert "\rround 2/2 arm 1/3 adaptive  | ratio to fixed 2: adaptive " in err
        assert ", A/A " in err and err.endswith("\n")
        assert bc.main(["--base-url", fake.url, "--policies", "fixed 2", "--rounds", "1", "--progress",
                        "--json", "-"]) == 0
    captured = capsys.readouterr()
    assert captured.err == "" and json.loads(captured.out)["rounds"] == 1


def test_progress_line_is_rewritten_in_place():
    stream = io.StringIO()
    p = bp.Progress(True, stream)
    p.show("round 1/2 long text")
    p.show("round 2/2")
    p.close()
    assert stream.getvalue() == "\rround 1/2 long text\rround 2/2          \n"


def test_plot_written_or_skipped(tmp_path, capsys, monkeypatch):
    pytest.importorskip("matplotlib")
    png = tmp_path / "p.png"
    with FakeServer() as fake:
        assert bc.main(["--base-url", fake.url, "--policies", "fixed 2,fixed 0", "--rounds", "2",
                        "--plot", str(png)]) == 0
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"plot written to {png}" in capsys.readouterr().out
        for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
            monkeypatch.delitem(sys.modules, name)
        monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now fails
        other = tmp_path / "q.png"
        assert bc.main(["--base-url", fake.url, "--policies", "fixed 2", "--rounds", "1", "--plot", str(other)]) == 0
    assert "matplotlib is not installed" in capsys.readouterr().out and not other.exists()


# --- the live estimate beside the measured ratio -----------------------------------------------

LIVE = """# HELP dspark_dynamic:estimated_speedup dspark_dynamic: estimated speed-up
# TYPE dspark_dynamic:estimated_speedup gauge
dspark_dynamic:estimated_speedup{phase="answer",vs="plain",engine="0"} 1.5
dspark_dynamic:estimated_speedup{phase="all",vs="plain",engine="0"} 1.2
dspark_dynamic:estimated_speedup{phase="all",vs="fixed",engine="0"} 0.9
dspark_dynamic:estimated_speedup{phase="all",vs="plain",engine="1"} 1.4
dspark_dynamic:estimated_speedup{phase="all",vs="fixed",engine="1"} 0.95
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 7.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 3.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",model_name="m",position="1"} 0.0
"""


def parsed(text):
    """Samples as ``bench_client.scrape_metrics`` keeps them."""
    from prometheus_client.parser import text_string_to_metric_families

    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_the_live_estimate_and_the_depth_are_read_from_the_metrics():
    samples = parsed(LIVE)
    assert live_check.estimated(samples) == pytest.approx({"plain": 1.3, "fixed": 0.925})  # engines' mean
    assert live_check.speculative_tokens(samples) == 2
    assert live_check.estimated(parsed("# TYPE x gauge\nx 1\n")) is None
    assert live_check.estimated(None) is None and live_check.speculative_tokens({}) is None


def test_the_estimate_is_set_beside_the_measured_ratio_of_the_servers_arm_over_fixed_n():
    arms, _ref, aa = bp.build_arms("fixed 2,server,fixed 0")
    rows = [{"round": r, "arm": arm, "tok_per_s": tok}
            for r, speeds in enumerate([(10.0, 9.0, 7.0), (10.0, 8.0, 7.0), (10.0, 9.5, 7.0)])
            for arm, tok in zip(("fixed 2", "server", "fixed 0"), speeds)]
    check = live_check.cross_check(parsed(LIVE), arms, rows, aa)
    assert (check["arm"], check["fixed_arm"]) == ("server", "fixed 2")
    assert check["measured"]["median"] == pytest.approx(0.9) and check["measured"]["n"] == 3
    lines = live_check.report_lines(check, True)
    assert lines[0] == ("live estimate (modelled by the server from its learned step costs and acceptance, decode "
                        "steps of its own policy): 1.300x plain, 0.925x fixed 2")
    assert lines[1] == ("  measured beside it: server / fixed 2 0.900 [0.850-0.925] (median of per-round ratios "
                        "[IQR], whole requests)")
    without = live_check.cross_check(parsed(LIVE), bp.build_arms("fixed 0,server")[0], rows, None)
    assert without["measured"] is None and "add 'fixed 2' to --policies" in live_check.report_lines(without, True)[1]
    no_n = live_check.cross_check(parsed(LIVE.split("# TYPE vllm")[0]), arms, rows, aa)
    assert "num_speculative_tokens is not on /metrics" in live_check.report_lines(no_n, True)[1]
    assert live_check.report_lines(None, False) == []
    assert live_check.report_lines(None, True)[0].startswith("live estimate not shown")


def test_a_run_prints_the_live_estimate_beside_the_measured_ratio(capsys):
    with FakeServer(extra=LIVE) as fake:
        assert bc.main(["--base-url", fake.url, "--policies", "fixed 2,server", "--rounds", "2", "--no-aa"]) == 0
    out = capsys.readouterr().out
    assert "live estimate (modelled by the server" in out and "0.925x fixed 2" in out
    assert "measured beside it: server / fixed 2" in out
    with FakeServer() as fake:
        assert bc.main(["--base-url", fake.url, "--policies", "fixed 2,server", "--rounds", "1", "--no-aa"]) == 0
    assert "live estimate not shown" in capsys.readouterr().out
