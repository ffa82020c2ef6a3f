"""A site's parts choose their ports around those the site has already chosen: a port chosen
but not bound yet (the supervisor's, chosen first so that Prometheus can scrape it) was once
chosen again for a server, and the supervisor then met Triton's gRPC port."""

from __future__ import annotations

import socket

import pytest

from sonicsite.local import control_plane, launcher
from sonicsite.local.errors import SiteError
from sonicsite.local.ports import PORT_RANGE_VARIABLE, free_ports
from sonicsite.local.state import LocalProcess, LocalServer, SiteState


def test_free_ports_in_a_range_never_hands_out_an_avoided_port(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # below the kernel's ephemeral ports (32768 on): no outgoing connection of another test
    # or process takes one of them meanwhile; above the suite's workers' ranges (conftest)
    monkeypatch.setenv(PORT_RANGE_VARIABLE, "30000-30019")
    avoid = set(range(30000, 30016))  # 16 of 20 taken: only 4 can be handed out
    for _ in range(50):
        chosen = free_ports(4, avoid=avoid)
        assert sorted(chosen) == [30016, 30017, 30018, 30019]
    with pytest.raises(OSError, match=PORT_RANGE_VARIABLE):
        free_ports(5, avoid=avoid)


def test_the_kernels_choice_is_refused_when_avoided(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel's pick (a bind to port 0) is random: two calls almost never overlap, so
    the kernel is made to pick an avoided port first (a bind to 0 bound to it), as it may
    when another part of the site has chosen that port and not bound it yet."""
    monkeypatch.delenv(PORT_RANGE_VARIABLE, raising=False)
    (avoided,) = free_ports(1)  # free now, not held: the kernel could hand it out again
    bind = socket.socket.bind
    forced: list[int] = []

    def kernel_picks_the_avoided_port_once(sock: socket.socket, address: tuple) -> None:
        host, port = address
        if port == 0 and not forced:
            forced.append(avoided)
            port = avoided
        bind(sock, (host, port))

    monkeypatch.setattr(socket.socket, "bind", kernel_picks_the_avoided_port_once)
    chosen = free_ports(4, avoid={avoided})
    assert forced == [avoided]  # it was handed out, and then refused
    assert avoided not in chosen and len(set(chosen)) == 4


def test_a_site_state_names_every_port_it_has_chosen() -> None:
    server = LocalServer("triton-0", "127.0.0.1", 20001, 20002, 20003)
    state = SiteState(site_dir="/nowhere", servers=[server])
    state.supervisor = "127.0.0.1:20004"
    state.operator = "127.0.0.1:20005"
    state.prometheus = "127.0.0.1:20006"
    state.processes.append(
        LocalProcess(
            name="gateway",
            kind="gateway",
            pid=1,
            command=("python", "--port=20007", "--grpc-port=20008", "--view=127.0.0.1:20009"),
        )
    )
    assert set(range(20001, 20010)) <= state.ports()


@pytest.mark.parametrize("given", ["42000-42000", "43000-42000", "80-90", "a-b", "42000"])
def test_a_bad_range_says_what_a_range_must_be(monkeypatch: pytest.MonkeyPatch, given) -> None:
    """ "expected LO-HI within 1024-65535" did not say that LO must be below HI."""
    monkeypatch.setenv(PORT_RANGE_VARIABLE, given)
    with pytest.raises(ValueError, match="expected LO-HI with 1024 <= LO < HI <= 65535"):
        free_ports(1)


def test_a_range_used_up_says_its_bounds_and_size(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PORT_RANGE_VARIABLE, "42100-42101")
    with pytest.raises(OSError, match=r"=42100-42101: no 3 free ports left in its 2$"):
        free_ports(3)


def test_up_with_more_servers_than_the_range_has_ports_names_both(
    monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    """It said "no 300000 free ports left", naming neither --servers nor the range, after
    it had made the site's folder. The whole site's need is counted, part by part."""
    monkeypatch.setenv(PORT_RANGE_VARIABLE, "42000-42999")
    with pytest.raises(SiteError) as refused:
        launcher.up(tmp_path / "site", servers=400)
    prometheus = ", 1 for Prometheus" if control_plane.prometheus_installed() else ""
    assert str(refused.value) == (
        f"servers: a site of 400 servers needs {1207 + bool(prometheus)} ports, over the 1000 "
        f"of {PORT_RANGE_VARIABLE}=42000-42999: 1200 for the servers (3 each), 6 for the "
        f"control plane (operator, Envoy, gateway){prometheus}, 1 for the supervisor"
    )
    assert not (tmp_path / "site").exists()
