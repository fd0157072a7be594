"""Where a backend sits in a job (``sampler.settings.placement``), and what each rank of a host samples.

torchrun starts one backend per GPU and tells each its place through ``RANK``, ``LOCAL_RANK``,
``WORLD_SIZE``, ``LOCAL_WORLD_SIZE`` and ``TORCHELASTIC_RUN_ID``. These tests pass an explicit
``environ`` dict where they can; the ones that go through ``os.environ`` (``from_environment()``
without one, a real ``ResourceMonitor``) set it with ``monkeypatch``, and the autouse ``hermetic``
fixture clears every launcher variable first. The GPU tests use the fake driver (``tests/fake_driver``)
through the real binding, as ``tests/test_gpu.py`` does.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import socket
from collections.abc import Iterator

import fake_driver
import pytest
from conftest import run_monitor, torchrun

import sampler
from sampler import settings
from sampler.collectors.gpu import GpuCollector
from sampler.collectors.gpu_devices import owned
from sampler.settings import placement
from sampler.settings.placement import HOST_WIDE_CATEGORIES, Placement, from_environment

HOST = placement.host_name()
FALLBACK = "monitoring this backend as rank 0 of a world of one"
ALONE = (0, 0, 1, 1)
"""(rank, local_rank, world_size, local_world_size) of a backend started without a launcher."""


def where(p: Placement) -> tuple[int, int, int, int]:
    return (p.rank, p.local_rank, p.world_size, p.local_world_size)


def sampler_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "sampler" and r.levelno >= logging.WARNING]


@pytest.fixture(autouse=True)
def capture(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="sampler")


# --------------------------------------------------------------------------- from_environment


def test_the_launcher_variables_are_these() -> None:
    assert placement.LAUNCHER_VARS == (
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "TORCHELASTIC_RUN_ID",
        "TORCHELASTIC_ERROR_FILE",
    )
    assert placement.HOST_WIDE_CATEGORIES == ("cpu", "memory", "disk", "network", "container")
    assert placement.HOST_SAMPLING_MODES == ("local_rank_0", "every_rank")
    assert placement.DEFAULT_HOST_SAMPLING == "local_rank_0"


def test_alone_without_a_launcher(caplog: pytest.LogCaptureFixture) -> None:
    p = from_environment({})
    assert p == Placement(HOST, 0, 0, 1, 1, f"{HOST}-{os.getpid()}")
    assert sampler_warnings(caplog) == []


def test_blank_variables_are_unset(caplog: pytest.LogCaptureFixture) -> None:
    blank = dict.fromkeys(placement.LAUNCHER_VARS, "  ")
    p = from_environment(blank)
    assert where(p) == ALONE and p.run_id == f"{HOST}-{os.getpid()}"
    assert sampler_warnings(caplog) == []


@pytest.mark.parametrize(
    ("rank", "local_rank"),
    [(0, 0), (1, 1), (2, 0), (3, 1)],  # host A holds ranks 0 and 1, host B ranks 2 and 3
)
def test_four_ranks_on_two_hosts(caplog: pytest.LogCaptureFixture, rank: int, local_rank: int) -> None:
    environ = torchrun(rank, local_rank, 4, 2, TORCHELASTIC_RUN_ID="job-42")
    p = from_environment(environ)
    assert p == Placement(HOST, rank, local_rank, 4, 2, "job-42")
    assert p.samples_host("local_rank_0") is (local_rank == 0)
    assert p.samples_host("every_rank") is True
    assert sampler_warnings(caplog) == []


def test_eight_ranks_on_one_host_and_surrounding_blanks(caplog: pytest.LogCaptureFixture) -> None:
    environ = {"RANK": " 5 ", "LOCAL_RANK": "5", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": " 8"}
    assert where(from_environment(environ)) == (5, 5, 8, 8)
    assert sampler_warnings(caplog) == []


def test_sizes_default_to_just_enough_ranks(caplog: pytest.LogCaptureFixture) -> None:
    # A launcher that sets only the ranks: the world is at least big enough to hold them.
    assert where(from_environment({"RANK": "3", "LOCAL_RANK": "1"})) == (3, 1, 4, 2)
    assert where(from_environment({"LOCAL_RANK": "0", "WORLD_SIZE": "2"})) == (0, 0, 2, 1)
    assert sampler_warnings(caplog) == []


def test_reads_the_process_environment_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in torchrun(1, 1, 2, 2, TORCHELASTIC_RUN_ID="from-os").items():
        monkeypatch.setenv(name, value)
    assert from_environment() == Placement(HOST, 1, 1, 2, 2, "from-os")
    assert from_environment(None, run_id="mine").run_id == "mine"


@pytest.mark.parametrize(
    ("environ", "fragment"),
    [
        ({"RANK": "x"}, "RANK='x' is not a whole number"),
        ({"RANK": "1.0"}, "RANK='1.0' is not a whole number"),
        ({"LOCAL_RANK": "-1"}, "LOCAL_RANK='-1' is not a whole number"),
        # int() takes all of these; a launcher writes none of them: digits 0-9 alone.
        ({"RANK": "1_0", "WORLD_SIZE": "16"}, "RANK='1_0' is not a whole number"),
        ({"RANK": "+1", "WORLD_SIZE": "2"}, "RANK='+1' is not a whole number"),
        ({"RANK": "\u0661", "WORLD_SIZE": "2"}, "RANK='\u0661' is not a whole number"),  # Arabic-Indic one
        ({"LOCAL_WORLD_SIZE": "\u00b2"}, "LOCAL_WORLD_SIZE='\u00b2' is not a whole number"),  # isdigit()
        ({"WORLD_SIZE": "1 0"}, "WORLD_SIZE='1 0' is not a whole number"),
        ({"WORLD_SIZE": "0"}, "WORLD_SIZE='0' is below 1"),
        ({"LOCAL_WORLD_SIZE": "abc"}, "LOCAL_WORLD_SIZE='abc' is not a whole number"),
        (torchrun(4, 0, 4, 1), "do not fit together"),  # rank past the world
        (torchrun(2, 2, 4, 2), "do not fit together"),  # local rank past the host's ranks
        (torchrun(0, 0, 4, 8), "do not fit together"),  # more ranks on the host than in the job
        ({"RANK": "1", "WORLD_SIZE": "1"}, "do not fit together"),
    ],
)
def test_a_bad_value_warns_once_and_falls_back_to_a_world_of_one(
    caplog: pytest.LogCaptureFixture, environ: dict[str, str], fragment: str
) -> None:
    p = from_environment({**environ, "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"})
    assert where(p) == ALONE
    assert p.run_id == f"{HOST}-{os.getpid()}"  # a world of one: the rendezvous address names nothing
    (message,) = sampler_warnings(caplog)
    assert fragment in message and FALLBACK in message and message.startswith("resource monitor: ")


def test_a_huge_bad_value_is_quoted_bounded(caplog: pytest.LogCaptureFixture) -> None:
    assert where(from_environment({"RANK": "x" * 100_000})) == ALONE
    (message,) = sampler_warnings(caplog)
    assert len(message) < 300 and "xxx..." in message


# --------------------------------------------------------------------------- run_id sources, in order


def test_an_explicit_run_id_beats_every_launcher_source() -> None:
    environ = torchrun(1, 1, 2, 2, TORCHELASTIC_RUN_ID="elastic", MASTER_ADDR="10.0.0.1", MASTER_PORT="29500")
    assert from_environment(environ, run_id="chosen").run_id == "chosen"


def test_torchelastic_run_id_beats_the_rendezvous_address() -> None:
    environ = torchrun(
        1, 1, 2, 2, TORCHELASTIC_RUN_ID=" elastic ", MASTER_ADDR="10.0.0.1", MASTER_PORT="29500"
    )
    assert from_environment(environ).run_id == "elastic"
    assert from_environment({"TORCHELASTIC_RUN_ID": "solo"}).run_id == "solo"  # a world of one too


@pytest.mark.parametrize("elastic", ["none", "None", "NONE", "", "  "])
def test_torchelastic_none_means_not_given(elastic: str) -> None:
    # torchrun without --rdzv-id sets TORCHELASTIC_RUN_ID=none in every rank of every launch.
    environ = torchrun(3, 1, 4, 2, TORCHELASTIC_RUN_ID=elastic, MASTER_ADDR="node-a", MASTER_PORT="29500")
    assert from_environment(environ).run_id == "node-a:29500"


def test_the_rendezvous_address_only_names_a_job_of_several_ranks() -> None:
    master = {"MASTER_ADDR": "node-a", "MASTER_PORT": "29500"}
    assert from_environment({**torchrun(0, 0, 2, 1), **master}).run_id == "node-a:29500"
    assert from_environment({**torchrun(0, 0, 1, 1), **master}).run_id == f"{HOST}-{os.getpid()}"


def error_file(log_dir: str, local_rank: int, attempt: int = 0) -> str:
    """``TORCHELASTIC_ERROR_FILE`` as torchrun's agent sets it for a rank."""
    return f"{log_dir}/attempt_{attempt}/{local_rank}/error.json"


def static(rank: int, local_rank: int, world: int, local_world: int, **more: str) -> dict[str, str]:
    """A rank of torchrun with the static rendezvous (``--master-port``, no ``--rdzv-id``)."""
    master = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "none"}
    return {**torchrun(rank, local_rank, world, local_world), **master, **more}


def test_one_agent_s_launches_at_one_address_get_their_own_run_id() -> None:
    """One agent runs every rank: its log directory, new at each launch, tells its launches apart."""
    launch = "/tmp/torchelastic_ilc0xrip/none_y4f71_j1"
    ids = {
        from_environment(static(r, r, 2, 2, TORCHELASTIC_ERROR_FILE=error_file(launch, r, attempt))).run_id
        for r in range(2)
        for attempt in range(3)  # a restart is the same launch
    }
    (run_id,) = ids
    assert re.fullmatch(r"127\.0\.0\.1:29500-[0-9a-f]{8}", run_id), run_id
    later = error_file("/tmp/torchelastic_q8xv1k2m/none_0d9a7c3b", 0)
    assert from_environment(static(0, 0, 2, 2, TORCHELASTIC_ERROR_FILE=later)).run_id not in (ids | {""})


@pytest.mark.parametrize(
    "error",
    [
        "",
        "/tmp/errors.json",  # set by hand, not torchrun's layout
        "/tmp/l/attempt_0/1/error.json",  # another local rank's
        "/tmp/l/attempt_x/0/error.json",
        "/tmp/l/attempt_0/0/errors.json",
        "l/attempt_0/0/error.json",  # relative: names no one directory
    ],
)
def test_an_error_file_not_laid_out_as_torchrun_s_leaves_the_address(error: str) -> None:
    environ = static(0, 0, 2, 2, TORCHELASTIC_ERROR_FILE=error)
    assert from_environment(environ).run_id == "127.0.0.1:29500"


def test_agents_on_several_hosts_share_the_address_alone() -> None:
    """Ranks under several agents (hosts) share nothing else: the store's reader tells their
    launches apart."""
    ids = {
        from_environment(
            static(2 * node + r, r, 4, 2, TORCHELASTIC_ERROR_FILE=error_file(f"/l{node}", r))
        ).run_id
        for node in range(2)
        for r in range(2)
    }
    assert ids == {"127.0.0.1:29500"}


@pytest.mark.parametrize(
    "master", [{"MASTER_ADDR": "node-a"}, {"MASTER_PORT": "29500"}, {"MASTER_ADDR": " "}]
)
def test_half_a_rendezvous_address_is_no_run_id(master: dict[str, str]) -> None:
    assert from_environment({**torchrun(1, 1, 2, 2), **master}).run_id == f"{HOST}-{os.getpid()}"


# --------------------------------------------------------------------------- Placement


def test_labels_name_the_backend_as_text() -> None:
    p = Placement("node-b", rank=3, local_rank=1, world_size=4, local_world_size=2, run_id="job-42")
    assert p.labels() == {"host": "node-b", "rank": "3", "local_rank": "1", "run_id": "job-42"}
    assert Placement("h").labels() == {"host": "h", "rank": "0", "local_rank": "0", "run_id": ""}


def test_samples_host() -> None:
    first, second = Placement("h", 0, 0, 2, 2), Placement("h", 1, 1, 2, 2)
    assert first.samples_host("local_rank_0") and first.samples_host("every_rank")
    assert not second.samples_host("local_rank_0") and second.samples_host("every_rank")
    assert Placement("h", 2, 0, 4, 2).samples_host("local_rank_0")  # local rank 0 of the second host


def test_placement_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        Placement("h").rank = 1  # type: ignore[misc]


def test_host_name_is_never_empty(monkeypatch: pytest.MonkeyPatch) -> None:
    assert placement.host_name() == socket.gethostname()
    monkeypatch.setattr(socket, "gethostname", lambda: "")
    assert placement.host_name() == "localhost"


# --------------------------------------------------------------------------- owned()

EIGHT = list(range(8))


@pytest.mark.parametrize(("local_rank", "expected"), [(0, [0, 4, 5, 6, 7]), (1, [1]), (2, [2]), (3, [3])])
def test_each_rank_owns_its_device_and_rank_0_the_unowned_ones(local_rank: int, expected: list[int]) -> None:
    assert owned(EIGHT, local_rank, 4) == expected


def test_every_device_once_over_the_ranks_of_a_host() -> None:
    for devices, ranks in [(8, 4), (8, 8), (8, 1), (3, 2), (2, 4)]:
        chosen = list(range(devices))
        parts = [owned(chosen, k, ranks) for k in range(ranks)]
        assert sorted(i for part in parts for i in part) == chosen, (devices, ranks, parts)


def test_more_ranks_than_devices() -> None:
    assert [owned([0, 1], k, 4) for k in range(4)] == [[0], [1], [], []]
    assert [owned([], k, 2) for k in range(2)] == [[], []]


def test_one_rank_takes_everything() -> None:
    assert owned(EIGHT, 0, 1) == EIGHT


def test_ownership_follows_cuda_order_not_nvml_order() -> None:
    cuda_order = [3, 2, 1, 0]
    assert owned(cuda_order, 0, 2) == [3, 1, 0]
    assert owned(cuda_order, 1, 2) == [2]


@pytest.mark.parametrize("local_rank", [0, 1, 3])
def test_one_each_keeps_the_rank_its_own_device(local_rank: int) -> None:
    assert owned([5], local_rank, 4, one_each=True) == [5]


# --------------------------------------------------------------------------- GpuCollector.open(share=...)


def device_indices(gpu: GpuCollector | None) -> list[int]:
    """The GPUs sampled, by NVML index (a MIG device's parent counts)."""
    return [] if gpu is None else sorted({int(name.split("/")[2].split("-")[0]) for name in gpu.names})


@pytest.fixture
def eight_gpus(nvml: fake_driver.Driver) -> Iterator[list[GpuCollector]]:
    """Eight fake GPUs, opened in this process; the collectors a test appends are closed at its end."""
    fake_driver.load()
    nvml.configure(devices=[{} for _ in range(8)])
    collectors: list[GpuCollector] = []
    yield collectors
    for gpu in collectors:
        gpu.close()


def open_share(
    collectors: list[GpuCollector], devices: str | tuple[str, ...], share: tuple[int, int] | None
) -> GpuCollector | None:
    gpu = GpuCollector.open("pynvml", devices, 0, share)
    if gpu is not None:
        collectors.append(gpu)
    return gpu


@pytest.mark.parametrize(
    ("share", "expected"),
    [
        (None, EIGHT),
        ((0, 4), [0, 4, 5, 6, 7]),
        ((1, 4), [1]),
        ((2, 4), [2]),
        ((3, 4), [3]),
        ((0, 8), [0]),
        ((7, 8), [7]),
        ((0, 1), EIGHT),
    ],
)
def test_open_with_a_share_keeps_this_ranks_part(
    eight_gpus: list[GpuCollector], share: tuple[int, int] | None, expected: list[int]
) -> None:
    gpu = open_share(eight_gpus, "all", share)
    assert device_indices(gpu) == expected
    assert gpu is not None and sorted(map(int, gpu.uuids)) == expected
    assert gpu.uuids == {str(i): fake_driver.default_uuid(i) for i in expected}


def test_a_rank_past_the_devices_gets_no_collector(nvml: fake_driver.Driver) -> None:
    fake_driver.load()
    nvml.configure(devices=[{}, {}])
    assert GpuCollector.open("pynvml", "all", 0, (2, 4)) is None
    assert not fake_driver.initialized()  # NVML was shut down again


@pytest.mark.parametrize(
    ("share", "expected"),
    [((0, 4), [0, 1, 2, 3, 7]), ((1, 4), [6]), ((2, 4), [5]), ((3, 4), [4])],
)
def test_a_share_of_the_visible_devices_follows_cuda_visible_devices_order(
    eight_gpus: list[GpuCollector],
    monkeypatch: pytest.MonkeyPatch,
    share: tuple[int, int],
    expected: list[int],
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "7,6,5,4,3,2,1,0")
    assert device_indices(open_share(eight_gpus, "visible", share)) == expected


@pytest.mark.parametrize("local_rank", [0, 2, 3])
def test_one_visible_device_per_rank_is_that_ranks_own(
    eight_gpus: list[GpuCollector], monkeypatch: pytest.MonkeyPatch, local_rank: int
) -> None:
    # A launcher that sets CUDA_VISIBLE_DEVICES per rank: local rank k sees only GPU k + 4.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", str(local_rank + 4))
    gpu = open_share(eight_gpus, "visible", (local_rank, 4))
    assert device_indices(gpu) == [local_rank + 4]
    assert gpu is not None and gpu.uuids == {str(local_rank + 4): fake_driver.default_uuid(local_rank + 4)}


def test_one_visible_device_of_many_by_uuid(
    eight_gpus: list[GpuCollector], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", fake_driver.default_uuid(6))
    assert device_indices(open_share(eight_gpus, "visible", (1, 2))) == [6]


def test_visible_without_cuda_visible_devices_shares_as_all_does(nvml: fake_driver.Driver) -> None:
    """CUDA_VISIBLE_DEVICES unset: CUDA sees every device, as with ``all``. A host with one GPU and
    two local ranks: no launcher made one device visible to each rank, so the GPU is rank 0's only,
    whichever of ``all`` and ``visible`` chose it (else a fleet view counts it twice)."""
    fake_driver.load()
    nvml.configure(devices=[{}])
    chosen: dict[tuple[str, int], list[int]] = {}
    for devices in ("all", "visible"):
        for local_rank in (0, 1):
            gpu = GpuCollector.open("pynvml", devices, 0, (local_rank, 2))
            chosen[devices, local_rank] = device_indices(gpu)
            if gpu is not None:
                gpu.close()
    assert chosen == {("all", 0): [0], ("all", 1): [], ("visible", 0): [0], ("visible", 1): []}


def test_uuids_are_read_once_and_blank_where_nvml_cannot_tell(nvml: fake_driver.Driver) -> None:
    fake_driver.load()
    nvml.configure(devices=[{"uuid": "GPU-one"}, {}, {}], fail={"nvmlDeviceGetUUID": [1]})
    gpu = GpuCollector.open("pynvml", "all")
    assert gpu is not None
    try:
        assert gpu.uuids == {"0": "GPU-one", "1": "", "2": fake_driver.default_uuid(2)}
        before = fake_driver.calls("nvmlDeviceGetUUID", 0)
        gpu.sample()
        assert fake_driver.calls("nvmlDeviceGetUUID", 0) == before
    finally:
        gpu.close()


# --------------------------------------------------------------------------- a real monitor on rank 1


def launched_as(monkeypatch: pytest.MonkeyPatch, **environ: str) -> None:
    for name, value in environ.items():
        monkeypatch.setenv(name, value)


def second_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process as local rank 1 of 2, in a job of 2 ranks on one host."""
    launched_as(monkeypatch, RANK="1", LOCAL_RANK="1", WORLD_SIZE="2", LOCAL_WORLD_SIZE="2")


def resource_categories(names: set[str]) -> set[str]:
    return {name.split("/")[1] for name in names if name.startswith("resource/")}


def test_rank_1_leaves_the_host_wide_categories_to_local_rank_0(monkeypatch: pytest.MonkeyPatch) -> None:
    second_rank(monkeypatch)
    monitor = sampler.ResourceMonitor(step_source="seconds")
    assert monitor.host_sampling == "local_rank_0"
    assert not set(HOST_WIDE_CATEGORIES) & set(monitor.categories)
    assert monitor.categories == ("gpu", "process", "process_tree", "pressure")
    assert monitor.placement == Placement(HOST, 1, 1, 2, 2, f"{HOST}-{os.getpid()}")
    every = sampler.ResourceMonitor(step_source="seconds", host_sampling="every_rank")
    assert every.categories == settings.DEFAULT_CATEGORIES and every.host_sampling == "every_rank"


def test_launcher_env_is_read_in_place_of_the_process_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """As Lightning's own launcher leaves rank 1 (``LOCAL_RANK`` and ``WORLD_SIZE``, no ``RANK``),
    with the ranks the framework knows given beside the process's rendezvous address."""
    launched_as(monkeypatch, LOCAL_RANK="1", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT="29500")
    assert sampler.ResourceMonitor(step_source="seconds").placement.rank == 0
    ranks = {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}
    monitor = sampler.ResourceMonitor(step_source="seconds", launcher_env={**os.environ, **ranks})
    assert monitor.placement == Placement(HOST, 1, 1, 2, 2, "127.0.0.1:29500")
    assert monitor.categories == ("gpu", "process", "process_tree", "pressure")


def test_local_rank_0_samples_the_host(monkeypatch: pytest.MonkeyPatch) -> None:
    launched_as(monkeypatch, RANK="2", LOCAL_RANK="0", WORLD_SIZE="4", LOCAL_WORLD_SIZE="2")
    assert sampler.ResourceMonitor(step_source="seconds").categories == settings.DEFAULT_CATEGORIES


def test_rank_1_logs_no_host_wide_signal(monkeypatch: pytest.MonkeyPatch) -> None:
    second_rank(monkeypatch)
    launched_as(monkeypatch, MASTER_ADDR="node-a", MASTER_PORT="29500")
    sink, stats = run_monitor(categories=["cpu", "memory", "disk", "network", "process", "container"])
    seen = resource_categories(sink.names())
    assert "process" in seen
    assert not seen & set(HOST_WIDE_CATEGORIES), sorted(sink.names())
    assert stats["placement"] == {
        "host": HOST,
        "rank": 1,
        "local_rank": 1,
        "world_size": 2,
        "local_world_size": 2,
        "run_id": "node-a:29500",
    }


def test_rank_1_samples_the_host_too_when_every_rank_does(monkeypatch: pytest.MonkeyPatch) -> None:
    second_rank(monkeypatch)
    sink, stats = run_monitor(
        categories=["cpu", "memory", "process"], host_sampling="every_rank", run_id="mine"
    )
    assert {"cpu", "memory", "process"} <= resource_categories(sink.names())
    assert stats["placement"]["rank"] == 1 and stats["placement"]["run_id"] == "mine"


def test_a_backend_alone_reports_its_placement() -> None:
    _, stats = run_monitor(categories=["cpu"])
    assert stats["placement"] == {
        "host": HOST,
        "rank": 0,
        "local_rank": 0,
        "world_size": 1,
        "local_world_size": 1,
        "run_id": f"{HOST}-{os.getpid()}",
    }


def test_each_local_rank_samples_its_own_gpu_through_a_real_monitor(
    monkeypatch: pytest.MonkeyPatch, nvml: fake_driver.Driver
) -> None:
    nvml.configure(devices=[{} for _ in range(4)])
    second_rank(monkeypatch)
    sink, _ = run_monitor(categories=["gpu"])
    assert sink.gpus() == {"1"}
    launched_as(monkeypatch, RANK="0", LOCAL_RANK="0")
    sink, _ = run_monitor(categories=["gpu"])
    assert sink.gpus() == {"0", "2", "3"}
    sink, _ = run_monitor(categories=["gpu"], host_sampling="every_rank")
    assert sink.gpus() == {"0", "1", "2", "3"}


def test_without_local_world_size_local_rank_0_takes_every_gpu(
    monkeypatch: pytest.MonkeyPatch, nvml: fake_driver.Driver
) -> None:
    nvml.configure(devices=[{} for _ in range(3)])

    def gpus() -> set[str]:
        sink, _ = run_monitor(categories=["gpu"])
        return sink.gpus()

    launched_as(monkeypatch, RANK="0", LOCAL_RANK="0", WORLD_SIZE="2")
    assert gpus() == {"0", "1", "2"}  # it cannot tell what rank 1 owns: shown twice, never lost
    launched_as(monkeypatch, RANK="1", LOCAL_RANK="1")
    assert gpus() == {"1"}
