"""The replay benchmark's bookkeeping on small synthetic pools whose best candidate is known."""

import json
import math

import numpy as np
import pytest

from tvm_fusion_ext.tools.tuning_lab import replay as rp
from tvm_fusion_ext.tools.tuning_lab.pool_file import Pool

N_FEATURES = 6


def synthetic_pool(n=60, seed=0, rejected=(), failed=(), name="toy", kernel="k", space="auto"):
    """Latency is a smooth function of the first two feature columns (a model can learn it); each candidate
    has two store rows (like a GEMM and its epilogue)."""
    rng = np.random.default_rng(seed)
    x = rng.random((n, N_FEATURES)).astype(np.float32)
    latency = 100.0 * (1.0 + 4.0 * (x[:, 0] - 0.3) ** 2 + 2.0 * (x[:, 1] - 0.7) ** 2)
    latency[list(failed)] = np.nan
    rows = np.concatenate([x, np.ones((n, N_FEATURES), np.float32)])   # row n: the shared epilogue row
    index = np.stack([np.arange(n), n + np.arange(n)], axis=1).reshape(-1).astype(np.int32)
    expert_rule = np.zeros(n, np.int8)
    expert_rule[list(rejected)] = 5
    run = np.repeat(latency[:, None], 3, axis=1).astype(np.float32)
    return Pool(meta={"task": name, "space": space, "kernel": kernel}, latency_us=latency, run_us=run,
                status=np.where(np.isfinite(latency), 0, 1).astype(np.int8), expert_rule=expert_rule,
                origin=np.ones(n, np.int8), parent=-np.ones(n, np.int32), load=np.zeros((n, 4), np.float32),
                feature_rows=rows, feature_index=index, feature_offsets=np.arange(0, 2 * n + 1, 2),
                expert_features=x[:, :3].copy(), path=f"{name}.npz")


class Oracle:
    """A perfect cost model: scores are the true throughput."""

    def __init__(self, pool):
        self.pool = pool
        self.observed = []

    def score(self, idx, seed):
        lat = self.pool.latency_us[np.asarray(idx)]
        return -np.where(np.isfinite(lat), lat, np.inf)

    def observe(self, idx):
        self.observed.append(list(idx))


FAST = ("random", "rank", "rank-expert")


@pytest.mark.parametrize("name", FAST + ("xgb",))
def test_search_is_deterministic_for_a_seed(name):
    pool = synthetic_pool()
    budget = 16 if name == "xgb" else 24   # XGBModel trains up to 10,000 rounds each time: keep it short
    runs = [rp.search(pool, rp.STRATEGIES[name], seed=3, budget=budget, k=4) for _ in range(2)]
    assert runs[0].order.tolist() == runs[1].order.tolist()
    other = rp.search(pool, rp.STRATEGIES[name], seed=4, budget=budget, k=4)
    assert other.order.tolist() != runs[0].order.tolist()


@pytest.mark.parametrize("name", FAST + ("xgb",))
def test_budget_respected_and_nothing_measured_twice(name):
    pool = synthetic_pool(failed=(5, 9))
    res = rp.search(pool, rp.STRATEGIES[name], seed=1, budget=30, k=8)   # 30 = 3 rounds of 8 + one of 6
    assert len(res.order) == 30 and len(set(res.order.tolist())) == 30
    assert len(res.curve) == 30 and np.all(np.diff(res.curve) <= 0)


def test_perfect_model_finds_the_best_in_the_first_round_it_predicts():
    pool = synthetic_pool(n=80)
    best = int(np.nanargmin(pool.latency_us))
    oracle = Oracle(pool)
    res = rp.search(pool, rp.STRATEGIES["rank"], seed=1, budget=32, k=8, model=oracle)
    # an oracle that scores from the start needs ceil(1 / k) = 1 round: the best is among the first k
    assert best in res.order[:8].tolist()
    assert rp.trials_to(res.curve, pool.latency_us[best]) <= 8
    assert [len(r) for r in oracle.observed] == [8, 8, 8, 8]
    assert res.order[:8].tolist() == np.argsort(pool.latency_us)[:8].tolist()  # greedy top-k, best first


def test_exploration_share_mixes_random_picks_into_each_round():
    pool = synthetic_pool(n=80)
    strategy = rp.Strategy("oracle-explore", "test", model="rank", explore=0.25)
    res = rp.search(pool, strategy, seed=1, budget=8, k=8, model=Oracle(pool))
    ranked = np.argsort(pool.latency_us).tolist()
    assert res.order[:6].tolist() == ranked[:6]          # 6 greedy picks, best first
    assert set(res.order[6:].tolist()).isdisjoint(ranked[:6]) and len(res.order) == 8  # + 2 random ones


def test_trials_to_counts_the_running_best_and_not_reached_is_budget_plus_one():
    curve = np.minimum.accumulate(np.array([9.0, np.inf, 5.0, 7.0, 3.0, 3.0]))
    assert rp.trials_to(curve, 5.0) == 3
    assert rp.trials_to(curve, 3.0) == 5
    assert rp.trials_to(curve, 2.0) == 7
    assert rp.trials_to(curve, 100.0) == 1


def test_random_trials_to_its_own_best_is_where_it_found_it():
    pool = synthetic_pool(n=100, failed=(1, 2))
    report = rp.evaluate(pool, [rp.STRATEGIES["random"]], seeds=[1, 2, 3, 4], budget=20, k=4)
    entry = report["strategies"]["random"]
    for seed, trials, final in zip([1, 2, 3, 4], entry["trials_to_random_best"], entry["final_best_us"]):
        res = rp.search(pool, rp.STRATEGIES["random"], seed, 20, 4)
        lat = pool.latency_us[res.order]
        assert trials == int(np.nanargmin(lat)) + 1
        assert math.isclose(final, np.nanmin(lat), abs_tol=1e-3)  # the report rounds to 1e-3 us
    assert entry["at_least_random_fraction"] == 1.0


def test_rules_are_never_broken_and_cost_no_trials():
    rejected = tuple(range(0, 60, 3))
    pool = synthetic_pool(rejected=rejected)
    for name in ("rank-expert", "xgb-expert"):
        res = rp.search(pool, rp.STRATEGIES[name], seed=2, budget=40, k=8)
        assert not set(res.order.tolist()) & set(rejected)
        assert len(res.order) == 40


def test_pool_smaller_than_budget_stops_when_every_candidate_is_measured():
    pool = synthetic_pool(n=20, rejected=(0, 1))
    res = rp.search(pool, rp.STRATEGIES["rank-expert"], seed=1, budget=64, k=8)
    assert sorted(res.order.tolist()) == list(range(2, 20))
    report = rp.evaluate(pool, [rp.STRATEGIES["rank-expert"]], seeds=[1], budget=64, k=8)
    assert len(report["strategies"]["rank-expert"]["curve_vs_pool_best"]["median"]) == 64


def test_a_learning_strategy_beats_random_on_a_learnable_pool():
    """Not a timing claim: on a pool whose latency is a smooth function of the features, a model that
    learns must reach random's final best in fewer trials than random needs (median over seeds)."""
    pool = synthetic_pool(n=400, seed=1)
    report = rp.evaluate(pool, [rp.STRATEGIES["rank"]], seeds=list(range(1, 9)), budget=48, k=8)
    s = report["strategies"]
    assert s["rank"]["trials_to_random_best_median"] < s["random"]["trials_to_random_best_median"]


def test_transfer_pretrains_only_on_other_tasks_of_the_same_kernel():
    target = synthetic_pool(seed=1, name="a")
    same_task_other_space = synthetic_pool(seed=2, name="a")
    other_task = synthetic_pool(seed=3, name="b")
    other_kernel = synthetic_pool(seed=4, name="c", kernel="attention")
    pools = [target, same_task_other_space, other_task, other_kernel]
    assert rp.transfer_sources(target, pools) == [other_task]
    model = rp.make_model(rp.STRATEGIES["rank-expert-transfer"], target, pools)
    assert model.base is not None and model.base.num_boosted_rounds() > 0
    alone = rp.make_model(rp.STRATEGIES["rank-expert-transfer"], target, [target, same_task_other_space, other_kernel])
    assert alone.base is None
    report = rp.evaluate(target, [rp.STRATEGIES["rank-expert-transfer"]], seeds=[1], budget=8, k=4, others=pools)
    assert report["transfer_sources"] == ["b-auto"]


def test_report_json_has_the_issue_fields_and_the_cli_refuses_bad_input(tmp_path, capsys):
    pool = synthetic_pool()
    report = rp.replay([pool], [rp.STRATEGIES["random"], rp.STRATEGIES["rank"]], seeds=[1, 2], budget=16, k=4)
    entry = report["tasks"]["toy-auto"]["strategies"]
    for name in ("random", "rank"):
        assert {"trials_to_random_best_median", "final_best_us_median"} <= set(entry[name])
    json.dumps(report)
    assert "toy-auto" in rp.format_table(report)
    assert rp.main(["--pools", str(tmp_path / "missing")]) == 2
    assert "error: no pool files" in capsys.readouterr().err


def test_knob_features_read_each_decision_of_a_trace():
    from tvm_fusion_ext.tune.knob_features import WIDTH, knob_row, knob_values

    trace = [[["GetSBlock", [], ["dense", "main"], ["b0"]],
              ["SamplePerfectTile", ["l1"], [2, 16], ["v2", "v3"]],
              ["SampleCategorical", [], [[0, 16, 64], [0.3, 0.3, 0.4]], ["v4"]],
              ["SampleComputeLocation", ["b0"], [], ["l5"]],
              ["SamplePerfectTile", ["l6"], [2, 64], ["v7", "v8"]]],   # no decision recorded: skipped
             [[1, [4, 8]], [2, 2], [3, -1]]]
    assert knob_values(trace) == [2.0, 3.0, 6.0, -1.0]
    row = knob_row(trace)
    assert row.shape == (WIDTH,) and row[:4].tolist() == [2.0, 3.0, 6.0, -1.0] and np.isnan(row[4:]).all()
    # a categorical value of 0 (e.g. "no unrolling") stays 0, it is not log2'd
    assert knob_values([trace[0], [[2, 0]]]) == [0.0]


def test_an_auto_pool_is_compared_with_its_tasks_template_pool():
    auto = synthetic_pool(seed=1, name="a")
    template = synthetic_pool(seed=2, name="a", space="template")
    template.latency_us = template.latency_us * 0.5            # the template is twice as fast
    report = rp.replay([auto], [rp.STRATEGIES["random"]], seeds=[1, 2], budget=16, k=4, all_pools=[auto, template])
    entry = report["tasks"]["a-auto"]
    assert entry["template_pool_best_us"] == pytest.approx(float(np.nanmin(template.latency_us)))
    s = entry["strategies"]["random"]
    assert s["throughput_vs_template_best_median"] == pytest.approx(entry["template_pool_best_us"]
                                                                     / s["final_best_us_median"])
    assert s["throughput_vs_template_best_median"] < 0.6 and s["seeds_at_least_0.9_of_template"] == 0.0
    assert "template_pool_best_us" not in rp.replay([template], [rp.STRATEGIES["random"]], seeds=[1], budget=8,
                                                    k=4, all_pools=[auto, template])["tasks"]["a-template"]


def test_cli_seed_range_starts_at_first_seed(monkeypatch, capsys):
    # --first-seed checks a choice made on seeds 1..50 against seeds it was not made on
    monkeypatch.setattr(rp, "load_dir", lambda directory: [synthetic_pool()])
    assert rp.main(["--strategies", "random", "--seeds", "3", "--first-seed", "51", "--budget", "8", "--k", "4",
                    "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["seed_list"] == [51, 52, 53] and report["seeds"] == 3


def test_noise_test_tells_separated_rounds_from_overlapping_ones():
    from tvm_fusion_ext.tools.tuning_lab.replay_noise import p_faster

    fast = np.array([100.0, 101.0, 102.0, 103.0, 104.0])
    # five rounds each, every fast round below every slow one: p = 1 / C(10, 5)
    assert p_faster(fast, fast + 10.0) == pytest.approx(1 / 252)
    # interleaved rounds (BERT's FFN pool: 3167.8 by the minimum, but 3227 / 3271 in the next rounds)
    assert p_faster(np.array([3167.8, 3227.4, 3271.1, 3342.4, 3413.2]),
                    np.array([3194.2, 3222.8, 3224.1, 3495.2, 8007.2])) > 0.3
    # the normal approximation agrees with the exact test where both apply
    rng = np.random.default_rng(0)
    a, b = rng.normal(100, 3, 40), rng.normal(103, 3, 40)
    assert p_faster(a, b) < 0.01 < p_faster(b, a)
    assert p_faster(np.array([]), fast) == 1.0


def test_within_noise_share_counts_only_losses_the_rounds_can_tell_apart():
    pool = synthetic_pool(n=40)
    order = np.argsort(pool.latency_us)
    runner_up, best, worst = int(order[1]), int(order[0]), int(order[-1])
    rounds = np.repeat(pool.latency_us[:, None], 5, axis=1) + np.arange(5)[None, :]   # 5 tight rounds each
    # the pool's best only by one lucky round: its other rounds interleave with the runner-up's
    rounds[best] = pool.latency_us[runner_up] + np.array([-3.0, -0.5, 0.0, 0.5, 3.0])
    pool.rounds_us = rounds.astype(np.float32)
    pool.latency_us = np.min(rounds, axis=1)
    assert int(np.argmin(pool.latency_us)) == best
    # three strategies' seeds end at the best, the runner-up and the worst; random found the best in each
    results = [rp.SearchResult(np.array([i]), pool.latency_us[[i]]) for i in (best, runner_up, worst)]
    assert [r.final_best <= pool.latency_us[best] for r in results] == [True, False, False]
    # losing to the best by the runner-up is within noise, by the worst it is not
    assert rp._within_noise(pool, results, [best] * 3) == pytest.approx(2 / 3)
    assert results[2].final_index(pool) == worst
    assert rp.SearchResult(np.array([3]), np.array([np.inf])).final_index(pool) == -1


class AntiOracle(Oracle):
    """Scores the slowest candidates highest: a model whose picks are easy to tell from the oracle's."""

    def score(self, idx, seed):
        return -super().score(idx, seed)


def test_handover_picks_with_the_first_model_until_at_then_with_the_second():
    from tvm_fusion_ext.tools.tuning_lab.replay_models import Handover

    pool = synthetic_pool(n=80)
    first, then = Oracle(pool), AntiOracle(pool)
    res = rp.search(pool, rp.STRATEGIES["handover-transfer"], seed=1, budget=24, k=8,
                    model=Handover(first, then, at=16))
    ranked = np.argsort(pool.latency_us).tolist()
    assert res.order[:16].tolist() == ranked[:16]       # two rounds by the first model, best first
    assert res.order[16:].tolist() == ranked[::-1][:8]  # then the second's picks
    assert first.observed == then.observed == [res.order[i:i + 8].tolist() for i in (0, 8, 16)]  # both learn


def test_handover_transfer_pretrains_both_parts_on_the_transfer_sources():
    target, other_task = synthetic_pool(seed=1, name="a"), synthetic_pool(seed=3, name="b")
    # handover-transfer's first part reads decisions from traces, which synthetic pools lack: store-feature twin
    options = dict(rp.STRATEGIES["handover-transfer"].options, first="rank-expert-transfer")
    strategy = rp.Strategy("handover-store", "test", model="handover", options=tuple(options.items()))
    model = rp.make_model(strategy, target, [target, other_task])
    assert model.at == 64
    assert model.first.base is not None and model.first.base.num_boosted_rounds() > 0  # a ranker's base
    assert model.then.model.booster is not None and "b-auto" in model.then.lookup.pools  # xgb-transfer
    twin = model.clone_for(target)
    assert twin.measured == 0 and twin.first.seen == [] and twin.first.base is model.first.base
