"""Generic profiler, auto_checkpoint and predicted vs measured peaks on plain-torch models (§4)."""
import pytest
import torch
from torch import nn

from stateremat.contract import OPTIONS, ProfileCard
from stateremat.planner import all_eager, plan
from stateremat.torch import (PeakMemory, apply_plan, auto_checkpoint, expected_peak_bytes, profile)
from stateremat.torch._segments import repeated_blocks, resolve_segments


class Block(nn.Module):
    def __init__(self, c_in, c_out, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.short = nn.Sequential() if stride == 1 and c_in == c_out else nn.Sequential(
            nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out))

    def forward(self, x):
        return torch.relu(self.bn2(self.conv2(torch.relu(self.bn1(self.conv1(x))))) + self.short(x))


class ResNet(nn.Module):
    """A small CIFAR-style ResNet with a wide full-resolution stem and a classifier head: the
    parts outside the segments that a card must not be blind to."""

    def __init__(self, width=8, classes=10, stem_factor=2):
        super().__init__()
        s = stem_factor * width
        self.stem = nn.Sequential(nn.Conv2d(3, s, 3, 1, 1, bias=False), nn.BatchNorm2d(s), nn.ReLU(),
                                  nn.Conv2d(s, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU())
        widths, layers, c = [width, 2 * width, 4 * width], [], width
        for i, w in enumerate(widths):
            layers.append(nn.Sequential(Block(c, w, 1 if i == 0 else 2), Block(w, w, 1)))
            c = w
        self.layer1, self.layer2, self.layer3 = layers
        self.head = nn.Sequential(nn.Linear(c, 64), nn.ReLU(), nn.Dropout(0.2), nn.Linear(64, classes))

    def forward(self, x, y):
        h = self.layer3(self.layer2(self.layer1(self.stem(x))))
        return nn.functional.cross_entropy(self.head(h.mean((2, 3))), y)


def _resnet(seed=0, **kw):
    torch.manual_seed(seed)
    return ResNet(**kw).double()


def _batch(n=16):
    g = torch.Generator().manual_seed(3)
    return torch.randn(n, 3, 16, 16, generator=g, dtype=torch.float64), torch.randint(0, 10, (n,), generator=g)


SEGMENTS = "layer?.*"


def _sgd_step(opt):
    def step(model):
        opt.zero_grad(set_to_none=True)
        model(*_batch()).backward()
        opt.step()
    return step


def _measured_peak(model, step, opt=None, inputs=()):
    """Peak bytes of one step, measured independently of the profiler (its own roots)."""
    step(model)  # warm: gradients and optimizer state exist, as in training
    state = (t for s in (opt.state.values() if opt else []) for t in s.values() if isinstance(t, torch.Tensor))
    grads = (p.grad for p in model.parameters() if p.grad is not None)  # a generator: no list holds them,
    with PeakMemory("cpu", roots=[*model.parameters(), *grads, *model.buffers(), *inputs, *state]) as pm:
        step(model)  # so zero_grad(set_to_none=True) frees the old gradients as in training
    return pm.peak_bytes


def _fingerprint(model, opt):
    out = {k: v.clone() for k, v in model.state_dict(keep_vars=True).items()}
    out.update({f"{n}.grad": (None if p.grad is None else p.grad.clone()) for n, p in model.named_parameters()})
    out["rng"] = torch.get_rng_state()
    out["opt"] = [(k, {a: (b.clone() if isinstance(b, torch.Tensor) else b) for a, b in s.items()})
                  for k, s in opt.state_dict()["state"].items()]
    out["attrs"] = [{k: v for k, v in vars(m).items() if not k.startswith("_") and not isinstance(v, torch.Tensor)}
                    for m in model.modules()]
    out["tensor_attrs"] = [(k, v.clone()) for m in model.modules() for k, v in vars(m).items()
                           if isinstance(v, torch.Tensor)]
    return out


def _same(a, b):
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def test_profile_leaves_model_gradients_rng_and_optimizer_exactly_as_they_were():
    model = _resnet()
    model.stem[0].seen = torch.zeros(2, dtype=torch.float64)  # a plain tensor attribute a hook writes
    model.stem[0].calls = 0
    def hook(m, args, out):
        m.seen.add_(1)
        m.calls += 1
    model.stem[0].register_forward_hook(hook)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    _sgd_step(opt)(model)  # gradients and Adam state exist before profiling
    torch.manual_seed(11)
    before = _fingerprint(model, opt)
    params = [p for p in model.parameters()]
    card = profile(model, SEGMENTS, _sgd_step(opt), repeats=1, optimizers=[opt])
    assert isinstance(card, ProfileCard) and len(card.segments) == 6
    after = _fingerprint(model, opt)
    assert after.keys() == before.keys()
    for k in before:
        assert _same(before[k], after[k]), k
    assert all(a is b for a, b in zip(params, model.parameters()))  # the same objects (the optimizer's)
    assert opt.param_groups[0]["params"][0] is params[0]
    assert all("forward" not in vars(m) for m in model.modules())  # no wrapper left behind


def test_card_has_every_registered_option_and_region_only_where_state_is_declared():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.Sequential(nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh()),
                          nn.Sequential(nn.Linear(32, 32), nn.BatchNorm1d(32)), nn.Linear(32, 1)).double()
    card = profile(model, ["1", "2"], torch.randn(16, 8, dtype=torch.float64), repeats=1)
    assert list(card.segments[0].options) == [o.name for o in OPTIONS if o.name != "region"]
    assert list(card.segments[1].options) == list(OPTIONS.names)
    assert card.segments[1].meta["state_bytes"] == 32 * 8 * 2 + 8  # running mean/var + num_batches_tracked
    assert card.meta["memory_method"] == "cpu_live_storage_tracker"
    p = card.meta["persistent"]
    assert card.persistent_bytes == p["first_segment_entry_bytes"] + p["outside_peak_allowance_bytes"]
    params = sum(t.nbytes for t in model.parameters())
    assert p["step_start_bytes"] >= 2 * params  # parameters and their gradients at least
    for seg in card.segments:
        for cost in seg.options.values():
            assert cost.time_s > 0
    # whole keeps less than eager between forward and backward (activations dropped)
    assert card.segments[0].options["whole"].retained_bytes < card.segments[0].options["eager"].retained_bytes


@pytest.mark.parametrize("between", [1.0, 0.5, 0.0])
def test_measured_peak_of_the_applied_plan_matches_the_prediction(between):
    model = _resnet()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    step = _sgd_step(opt)
    card = profile(model, SEGMENTS, step, repeats=1, optimizers=[opt])
    lo, hi = plan(card, 0).min_feasible_peak_bytes, all_eager(card, 1).predicted_peak_bytes
    budget = int(lo + between * (hi - lo))  # from all-eager's peak down to the least any plan needs
    res = plan(card, budget, planner="joint")
    assert res.feasible
    apply_plan(model, res)
    measured = _measured_peak(model, step, opt)
    expected = expected_peak_bytes(card, res.options)
    assert expected <= res.predicted_peak_bytes <= budget
    assert abs(measured - expected) <= 0.05 * expected, (measured, expected, res.options)
    assert measured <= 1.05 * budget


def test_a_card_blind_to_the_stem_and_head_misses_the_budget_and_ours_does_not():
    """The README's known miss: a ResNet with a stem and a head, planned on a card whose P holds only
    parameters, gradients, optimizer state and the batch, measured 13 % over its prediction."""
    model = _resnet()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    step = _sgd_step(opt)
    card = profile(model, SEGMENTS, step, repeats=1, optimizers=[opt])
    parts = card.meta["persistent"]
    assert parts["head_bytes"] > 0
    res = plan(card, int(0.8 * all_eager(card, 1).predicted_peak_bytes), planner="joint")
    apply_plan(model, res)
    measured = _measured_peak(model, step, opt)
    assert measured <= res.budget_bytes * 1.05
    # the blind card: the same segments, P without the stem's activations, q without the head
    last = card.segments[-1].options[res.options[-1]]
    blind_q = max([s.options[o].temp_bytes for s, o in zip(card.segments[:-1], res.options[:-1])]
                  + [last.temp_bytes - parts["head_bytes"]])
    blind = parts["step_start_bytes"] + sum(s.options[o].retained_bytes for s, o in zip(card.segments, res.options)) \
        + max(0, blind_q)
    assert measured > 1.05 * blind  # what the README reported (13 % over a blind prediction)


def test_auto_checkpoint_profiles_plans_and_wraps_in_place():
    model = _resnet()
    names = [n for n, _ in model.named_parameters()]
    keys = list(model.state_dict())
    x, y = _batch()
    with pytest.raises(ValueError, match="no checkpoint plan fits the budget 1.00 KiB") as info:
        auto_checkpoint(model, 1024, sample=(x, y), segments=SEGMENTS, repeats=1)
    assert all("forward" not in vars(m) for m in model.modules())  # left unwrapped
    assert not info.value.plan.feasible and info.value.plan.card.segment_names[0] == "layer1.0"
    eager = all_eager(profile(model, SEGMENTS, (x, y), repeats=1), 1).predicted_peak_bytes
    res = auto_checkpoint(model, int(0.75 * eager), sample=(x, y), segments=SEGMENTS, repeats=1)
    assert res.feasible and "region" in res.options or "whole" in res.options
    text = res.explain()
    assert "layer1.0" in text and "expected peak" in text
    assert [n for n, _ in model.named_parameters()] == names and list(model.state_dict()) == keys
    wrapped = {n: m.forward.option for n, m in model.named_modules() if "forward" in vars(m)}
    assert wrapped == {n: o for n, o in zip(res.segment_names, res.options) if o != "eager"}
    with pytest.raises(ValueError, match="exactly one of sample= .* and step_fn="):
        auto_checkpoint(model, "1GiB")


def test_segments_rules():
    model = _resnet()
    blocks = [f"layer{i}.{j}" for i in (1, 2, 3) for j in (0, 1)]
    assert resolve_segments(model, "layer?.*") == blocks
    assert repeated_blocks(model) == blocks == resolve_segments(model, None)
    assert resolve_segments(model, model.layer2) == ["layer2.0", "layer2.1"]
    assert resolve_segments(model, ["layer2.1", "layer1.0"]) == ["layer1.0", "layer2.1"]  # forward order
    with pytest.raises(ValueError, match="lies inside segment 'layer1'"):
        resolve_segments(model, ["layer1", "layer1.0"])
    with pytest.raises(ValueError, match="selects no submodule"):
        resolve_segments(model, "blocks.*")
    with pytest.raises(ValueError, match="'nope' is not a submodule"):
        resolve_segments(model, ["nope"])
    with pytest.raises(ValueError, match="unique"):
        resolve_segments(model, ["stem", "stem"])


def test_profile_refuses_segments_that_do_not_run_once_and_unknown_options():
    torch.manual_seed(0)
    lin = nn.Linear(4, 4).double()
    twice = nn.Sequential(lin, nn.Tanh(), lin)
    with pytest.raises(ValueError, match="segment '0' ran twice in one step"):
        profile(twice, ["0"], torch.randn(3, 4, dtype=torch.float64), repeats=1)
    with pytest.raises(ValueError, match=r"segment\(s\) \['layers.1'\] did not run"):
        profile(_Skip(), ["layers.0", "layers.1"],
                torch.randn(3, 4, dtype=torch.float64), repeats=1)
    with pytest.raises(ValueError, match="unknown option 'offload'"):
        profile(twice, ["1"], torch.randn(3, 4, dtype=torch.float64), options=["eager", "whole", "offload"])
    with pytest.raises(ValueError, match=r"options must include \['whole'\]"):
        profile(twice, ["1"], torch.randn(3, 4, dtype=torch.float64), options=["eager"])


class _Skip(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4)]).double()

    def forward(self, x):
        return self.layers[0](x)


def test_peak_memory_roots_freed_inside_the_block_stop_counting_and_new_storages_are_listed():
    holder = [torch.zeros(1024)]  # a 4 KiB root, freed inside the block (like zero_grad(set_to_none=True))
    with PeakMemory("cpu", roots=holder) as pm:
        holder.clear()
        assert pm.current_bytes == 0
        b = torch.ones(512)  # 2 KiB, created inside
        assert pm.current_bytes == 2048
        new = pm.new_storages()
    assert pm.peak_bytes == 4096  # the root's bytes at entry
    assert [st.nbytes() for st in new] == [2048] and new[0].data_ptr() == b.untyped_storage().data_ptr()
    with PeakMemory("cpu", roots=new) as pm2:  # storages are roots too
        pass
    assert pm2.baseline_bytes == 2048


def test_profile_step_argument_errors():
    model = _resnet()
    with pytest.raises(TypeError, match="sample must be a tensor, a tuple"):
        profile(model, SEGMENTS, 3)
    with pytest.raises(TypeError, match="expected a step function"):
        profile(model, SEGMENTS)
    with pytest.raises(ValueError, match="repeats must be a positive int"):
        profile(model, SEGMENTS, _batch(), repeats=0)


@pytest.mark.parametrize("device, error, phrase", [
    ("tpu", ValueError, "is not a device this torch can use"),
    ("cuda:x", ValueError, "is not a device this torch can use"),
    ("meta", ValueError, "is not supported \\(expected cpu or cuda"),
    (True, TypeError, "device must be a torch.device"),
    (3.5, TypeError, "device must be a torch.device"),
    pytest.param("cuda", ValueError, "sees no CUDA device",
                 marks=pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is present")),
])
def test_profile_and_auto_checkpoint_refuse_a_bad_device_before_any_work(device, error, phrase):
    """A device that torch cannot parse, or one memory is not measured on, is refused with the
    API's name and a tip (before: torch's raw RuntimeError/TypeError), and the model is untouched."""
    from stateremat.torch import auto_checkpoint

    model = _resnet()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(error, match=phrase) as e:
        profile(model, SEGMENTS, _batch(), device=device)
    assert str(e.value).startswith("stateremat.torch.profile: ") and "Tip:" in str(e.value)
    with pytest.raises(error, match=phrase):
        auto_checkpoint(model, budget=0.9, sample=_batch(), segments=SEGMENTS, device=device)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert "forward" not in vars(model.layer1[0])  # nothing was wrapped


class _Writer(nn.Module):
    """Reads the shared buffer, then writes rows of it in place (a MoCo-style queue shared by blocks)."""

    def __init__(self, shared, rows):
        super().__init__()
        self.lin = nn.Linear(16, 16)
        self.register_buffer("shared", shared)
        self.rows = rows

    def forward(self, x):
        y = torch.tanh(self.lin(x)) * (1 + self.shared[: len(x)])
        self.shared[self.rows] = y.detach()[: len(self.rows)]
        return y


def _shared_chain():
    torch.manual_seed(0)
    shared = torch.zeros(4096, 16, dtype=torch.float64)
    return nn.Sequential(*[_Writer(shared, torch.arange(64 * i, 64 * i + 8)) for i in range(3)]).double()


def test_region_retained_bytes_include_later_writes_to_shared_state_r6():
    x = torch.randn(8, 16, dtype=torch.float64)
    model = _shared_chain()
    card = profile(model, ["0", "1", "2"], x, repeats=1, granularity_bytes=64)
    journals = [s.meta["region_chain_journal_bytes"] for s in card.segments]
    assert journals[0] > journals[1] > journals[2] > 0  # earlier segments hold later writes too
    # the plan then runs under journal_writes() and matches eager bit for bit
    from stateremat.torch import journal_writes

    ref, ours = _shared_chain(), _shared_chain()
    apply_plan(ours, {"options": ["region", "eager", "whole"], "segment_names": ["0", "1", "2"]},
               granularity_bytes=64)
    ref(x).pow(2).sum().backward()
    with journal_writes():
        y = ours(x)
    y.pow(2).sum().backward()
    for (n, a), b in zip(ref.named_parameters(), ours.parameters()):
        assert torch.equal(a.grad, b.grad), n
    assert torch.equal(ref[0].shared, ours[0].shared)


@pytest.mark.parametrize("make_opt", [lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
                                      lambda ps: torch.optim.Adam(ps, lr=1e-2)], ids=["sgd_momentum", "adam"])
def test_an_optimizer_not_given_is_found_restored_and_counted_like_a_given_one(make_opt):
    """C8 of the user review: step_fn steps an optimizer the caller forgot to pass; its momentum
    and step counts must not advance through profiling, and P must count its state."""
    cards = {}
    for given in (True, False):
        model = _resnet()
        opt = make_opt(model.parameters())
        _sgd_step(opt)(model)  # optimizer state exists before profiling
        before = _fingerprint(model, opt)
        cards[given] = profile(model, SEGMENTS, _sgd_step(opt), repeats=1, optimizers=[opt] if given else ())
        after = _fingerprint(model, opt)
        for k in before:
            assert _same(before[k], after[k]), (given, k)
        step_counts = [float(s["step"]) for s in opt.state_dict()["state"].values() if "step" in s]
        assert step_counts in ([], [1.0] * len(step_counts))  # one step before profiling, none since
    assert cards[True].persistent_bytes == cards[False].persistent_bytes
    assert [s.options["eager"].retained_bytes for s in cards[True].segments] == \
        [s.options["eager"].retained_bytes for s in cards[False].segments]


@pytest.mark.parametrize("stem_option", list(OPTIONS.names))
@pytest.mark.parametrize("rest", ["eager", "whole"])
def test_a_first_segment_on_the_batch_has_its_backward_in_q(stem_option, rest):
    """The stem as the first segment: its input (the batch) needs no gradient, so its backward
    has no end-of-backward event of its own and, in torch's hook order, the next segment's
    bwd_end fires right after its bwd_start. Its backward (replay, gradients) must still count
    in its q: predicted = measured within 5 % for the stem under every option. The stem is wide
    (64 channels at full resolution), so its backward is the step's peak."""
    import dataclasses

    model = _resnet(stem_factor=8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    step = _sgd_step(opt)
    card = profile(model, ["stem", *resolve_segments(model, SEGMENTS)], step, repeats=1, optimizers=[opt])
    assert card.segments[0].name == "stem"
    options = (stem_option,) + (rest,) * (len(card.segments) - 1)
    res = dataclasses.replace(plan(card, 1 << 40, planner="joint"), options=options)
    apply_plan(model, res)
    measured = _measured_peak(model, step, opt)
    expected = expected_peak_bytes(card, options)
    assert abs(measured - expected) <= 0.05 * expected, (measured, expected, options)


@pytest.mark.parametrize("given", [True, False], ids=["given", "found"])
def test_parameters_an_optimizer_steps_outside_the_model_are_restored(given):
    """Attack finding: a learnable temperature outside the model, in the same optimizer, moved 12
    steps through profiling while the optimizer's state was put back: the two out of step."""
    model = _resnet()
    scale = nn.Parameter(torch.ones((), dtype=torch.float64))
    opt = torch.optim.Adam([*model.parameters(), scale], lr=1e-2)

    def step(m):
        opt.zero_grad(set_to_none=True)
        (m(*_batch()) * scale).backward()
        opt.step()
    step(model)
    before = _fingerprint(model, opt)
    s0, g0 = scale.detach().clone(), scale.grad.clone()
    profile(model, SEGMENTS, step, repeats=1, optimizers=[opt] if given else ())
    after = _fingerprint(model, opt)
    for k in before:
        assert _same(before[k], after[k]), k
    assert torch.equal(scale.detach(), s0)
    if given:  # a found optimizer is seen only at its first step, after that step's backward
        assert torch.equal(scale.grad, g0)


@pytest.mark.parametrize("option", list(OPTIONS.names))
def test_a_stem_outside_the_segments_has_its_backward_charged(option):
    """issue 27 item 6: a wide stem that is no segment runs its backward after every segment's
    backward has ended and before the backward pass does; at stem_factor=8 that is the step's
    peak under whole/region, which the card missed (measured 1.24 x the expected peak). The card
    now records it (meta.persistent.before_first_segment_backward_peak_bytes) and a measured plan
    lands within 5 % of its expected peak under every option."""
    import dataclasses

    model = _resnet(stem_factor=8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    step = _sgd_step(opt)
    card = profile(model, resolve_segments(model, SEGMENTS), step, repeats=1, optimizers=[opt])
    options = tuple(option if option in s.options else "whole" for s in card.segments)
    res = dataclasses.replace(plan(card, 1 << 40, planner="joint"), options=options)
    apply_plan(model, res)
    measured = _measured_peak(model, step, opt)
    expected = expected_peak_bytes(card, options)
    assert card.meta["persistent"]["before_first_segment_backward_peak_bytes"] > 0
    assert abs(measured - expected) <= 0.05 * expected, (measured, expected, options)


def test_a_gradient_accumulation_step_is_refused_and_its_tip_one_micro_batch_then_accumulate_works():
    """A step_fn of two micro-batches runs every segment twice: refused, with the tip to profile one
    micro-batch; following it (auto_checkpoint on one micro-batch, then training with accumulation)
    gives eager's parameters and BatchNorm statistics bit for bit."""
    def model():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(8, 64), *[nn.Sequential(nn.Linear(64, 64), nn.BatchNorm1d(64), nn.Tanh())
                                                 for _ in range(3)], nn.Linear(64, 2)).double()

    xs = [torch.randn(128, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(i)) for i in range(4)]

    def accumulate(m, opt, batches):
        opt.zero_grad()
        for x in batches:
            (m(x).square().mean() / len(batches)).backward()
        opt.step()

    m = model()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="ran twice in one step") as e:
        auto_checkpoint(m, 0.9, step_fn=lambda mm: accumulate(mm, opt, xs[:2]), segments=["1", "2", "3"],
                        optimizers=[opt])
    assert "profile a step_fn of one micro-batch" in str(e.value)
    # the tip, literally: one micro-batch for profiling, then accumulation
    res = auto_checkpoint(m, 0.9, step_fn=lambda mm: accumulate(mm, opt, xs[:1]), segments=["1", "2", "3"],
                          optimizers=[opt])
    assert any(o != OPTIONS.baseline for o in res.options), res.options  # something is checkpointed
    ref = model()
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for step in range(2):
        accumulate(m, opt, xs[2 * step: 2 * step + 2])
        accumulate(ref, ref_opt, xs[2 * step: 2 * step + 2])
    for (n, a), b in zip(m.state_dict().items(), ref.state_dict().values()):
        assert torch.equal(a, b), n
