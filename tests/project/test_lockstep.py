"""``benchmarks/fidelity/lockstep.py`` and its FedRCL / FedACG side's shims, without the
authors' code: their calls transliterated (skynbe/FedRCL @ 378beb4 and geehokim/FedACG @
62b6e95, ``trainers/base_trainer.py``'s client draw, ``datasets/build.py``'s CIFAR
training transform), the shims fed the plan, and the comparison's closed forms."""

import re
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks" / "fidelity"))

import _lockstep_trainer as family  # noqa: E402
import lockstep  # noqa: E402

pytestmark = pytest.mark.unit

MEAN, STD = family.NORMALIZE["mean"], family.NORMALIZE["std"]


def _their_train_transform():
    """Their CIFAR training transform (``datasets/build.py``), transliterated."""
    import torchvision.transforms as T

    return T.Compose(
        [
            T.RandomRotation(10),
            T.RandomCrop(32, padding=4),
            T.RandomHorizontalFlip(),
            T.ToTensor(),
            T.Normalize(MEAN, STD),
        ]
    )


def _plan(rounds=((3, 1), (0, 2)), n=4):
    rng = np.random.default_rng(0)
    parts = [np.arange(10 * c, 10 * c + 10, dtype=np.int64) for c in range(n)]
    eps = {}
    for r, clients in enumerate(rounds, start=1):
        for c in clients:
            order = rng.permutation(parts[c])
            eps[(r, c)] = [
                lockstep.EpochPlan(
                    order=order,
                    bounds=np.array([0, 4, 8, 10]),
                    angle=rng.uniform(-10, 10, 10).astype(np.float32),
                    top=rng.integers(0, 9, 10),
                    left=rng.integers(0, 9, 10),
                    flip=rng.random(10) < 0.5,
                )
            ]
    return lockstep.Plan(
        names=["w"],
        initial=[np.ones((2, 3), np.float32)],
        rounds=[list(c) for c in rounds],
        partitions=parts,
        epoch_plans=eps,
        meta={"crop_pad": 4},
    )


def test_their_client_draw_returns_the_plan_and_refuses_another_call():
    plan = _plan()
    fake_np = family.PlannedNumpy(np, plan, num_clients=4)
    # their Trainer.train, per round: np.random.choice(range(N), M, replace=False)
    assert list(fake_np.random.choice(range(4), 2, replace=False)) == [3, 1]
    assert list(fake_np.random.choice(range(4), 2, replace=False)) == [0, 2]
    assert fake_np.zeros(2).shape == (2,)  # anything else is NumPy's
    with pytest.raises(RuntimeError, match="not their trainer's call"):
        family.PlannedNumpy(np, plan, 4).random.choice(range(4), 2, replace=True)
    with pytest.raises(RuntimeError, match="samples 3 clients"):
        family.PlannedNumpy(np, plan, 4).random.choice(range(4), 3, replace=False)


def test_planned_transforms_give_our_augmentation_of_the_same_draws():
    from PIL import Image

    from fedrcl_flwr.augment import AugmentSpec
    from fedrcl_flwr.data.datasets import AugmentDraws, ImageArrayDataset

    u8 = torch.randint(0, 256, (3, 3, 32, 32), dtype=torch.uint8)
    spec = AugmentSpec(crop_pad=4, flip=True, rotation=10, pad_fill="black")
    ours = ImageArrayDataset(u8, np.zeros(3), MEAN, STD, spec)
    draws = AugmentDraws(
        angles=torch.tensor([0.0, 7.5, -3.25]),
        top=torch.tensor([0, 4, 8]),
        left=torch.tensor([8, 1, 4]),
        flip=torch.tensor([True, False, True]),
    )
    want = ours.apply_augment(u8, draws)
    transform = _their_train_transform()
    planned = family.PlannedTransforms(transform)
    assert planned.crop_pad == 4
    for i in range(3):
        img = Image.fromarray(u8[i].permute(1, 2, 0).numpy())
        d = {
            "angle": float(draws.angles[i]),
            "top": int(draws.top[i]),
            "left": int(draws.left[i]),
            "flip": bool(draws.flip[i]),
        }
        torch.manual_seed(i)  # their global generator no longer decides anything
        with planned.use(d):
            got = transform(img)
        torch.testing.assert_close(got, want[i], atol=1e-6, rtol=0)
    # identity draws: their training chain leaves the test pipeline's image
    img = Image.fromarray(u8[0].permute(1, 2, 0).numpy())
    with planned.use(lockstep.identity_draw(planned.crop_pad)):
        got = transform(img)
    torch.testing.assert_close(got, ours.plain()[0][0], atol=1e-6, rtol=0)


def test_planned_transforms_refuse_a_read_that_skips_a_draw():
    import torchvision.transforms as T

    transform = _their_train_transform()
    planned = family.PlannedTransforms(transform)
    with pytest.raises(RuntimeError, match="took the draws"):
        with planned.use(lockstep.identity_draw(4)):
            pass  # nothing read: no draw taken
    only_flip = family.PlannedTransforms(T.Compose([T.RandomHorizontalFlip(), T.ToTensor()]))
    with pytest.raises(RuntimeError, match="does not make"):
        only_flip.use({"angle": 5.0, "top": None, "left": None, "flip": True}).__enter__()


def test_planned_batches_yield_the_plans_batches_as_positions_of_their_subset():
    plan = _plan()
    ep = plan.epochs(1, 3)[0]
    their_indices = list(reversed(plan.partition(3).tolist()))  # their subset's own order
    positions = {g: i for i, g in enumerate(their_indices)}
    sampler = family.PlannedBatches([ep], positions, crop_pad=4, augment=True)
    batches = list(sampler)
    assert len(sampler) == 3
    assert [[their_indices[p] for p, _ in b] for b in batches] == [b.tolist() for b in ep.batches()]
    assert batches[2][1][1] == ep.draws(9)
    with pytest.raises(RuntimeError, match="local epoch 2"):
        list(sampler)
    off = list(family.PlannedBatches([ep], positions, crop_pad=4, augment=False))
    assert {tuple(sorted(d.items())) for b in off for _, d in b} == {
        tuple(sorted(lockstep.identity_draw(4).items()))
    }


def test_check_split_accepts_only_our_split_client_for_client():
    plan = _plan()
    family.check_split({c: list(reversed(p)) for c, p in enumerate(plan.partitions)}, plan)
    bad = {c: list(p) for c, p in enumerate(plan.partitions)}
    bad[1], bad[2] = bad[2], bad[1]
    with pytest.raises(RuntimeError, match="client 1"):
        family.check_split(bad, plan)


def test_plan_files_round_trip(tmp_path):
    plan = _plan()
    plan.save(tmp_path / "plan")
    back = lockstep.Plan.load(tmp_path / "plan")
    assert back.rounds == plan.rounds and back.meta == plan.meta
    for (key, eps), (key2, eps2) in zip(
        sorted(plan.epoch_plans.items()), sorted(back.epoch_plans.items())
    ):
        assert key == key2
        assert [b.tolist() for b in eps[0].batches()] == [b.tolist() for b in eps2[0].batches()]
        assert eps[0].draws(3) == eps2[0].draws(3)
    assert torch.equal(back.initial_state()["w"], torch.ones(2, 3))


def test_comparison_closed_forms_and_the_last_line():
    theirs = {"a": np.array([2.0, -4.0]), "b": np.zeros(3)}
    ours = {"a": np.array([2.0, -4.002]), "b": np.array([0.0, 1e-7, 0.0])}
    assert lockstep.max_rel_weight_diff(ours, theirs) == pytest.approx(0.002 / 4)
    with pytest.raises(ValueError, match="differ"):
        lockstep.max_rel_weight_diff({"a": ours["a"]}, theirs)
    assert lockstep.identical_share([1, 2, 3, 4], [1, 2, 0, 4]) == 75.0
    assert lockstep.steady_seconds_per_round({1: 10.0, 2: 13.0, 3: 16.0, 4: 19.0}) == 3.0
    rows = [
        {"round": 5, "weight_diff": 3.2e-7, "identical_pct": 100.0},
    ]
    line = lockstep.last_line("fedrcl", rows, 1.234, 5.678)
    assert re.fullmatch(
        r"lockstep fedrcl: max rel weight diff 3\.20e-07 after 5 rounds; identical "
        r"predictions 100\.00 %; ours 1\.23 s/round, theirs 5\.68 s/round",
        line,
    )


def test_recorder_ends_the_round_where_the_observation_begins():
    rec = lockstep.Recorder()
    with pytest.raises(RuntimeError):
        rec.round(1, {}, 0.0, [])
    rec.start()
    with rec.observing():
        t = rec._now - rec._start  # the round ends where the observation begins
        rec.round(1, {"w": np.ones(1)}, 50.0, [1, 2])
    assert rec.trace.clock[1] == t
    assert rec._excluded > 0  # the observation's time is set aside
    assert rec.trace.accuracy[1] == 50.0


def test_first_departure_names_the_round_and_the_entry():
    rows = [
        {"round": 1, "weight_diff": 1e-7, "identical_pct": 100.0},
        {"round": 2, "weight_diff": 5e-5, "identical_pct": 99.0},
        {"round": 3, "weight_diff": 2e-3, "identical_pct": 100.0},
    ]
    assert lockstep.first_departure(rows)["round"] == 2
    assert lockstep.first_departure(rows[:1]) is None
    theirs = {"a": np.array([1.0, 2.0]), "b": np.array([10.0])}
    ours = {"a": np.array([1.0, 2.001]), "b": np.array([10.001])}
    assert lockstep.worst_entry(ours, theirs) == "a"
