"""One call of DigitalOcean's API for `inference-image fleet`: pydo's client, the shapes its
answers must have, and a deadline on the whole call (answer included)."""

from __future__ import annotations

import os
import re
import signal
import threading
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, IPvAnyAddress, StringConstraints, ValidationError


class FleetError(Exception):
    """What went wrong with a fleet, in one line."""


def client() -> Any:
    """pydo's client, or FleetError naming what is missing."""
    token = os.environ.get("DIGITALOCEAN_TOKEN", "").strip()
    if not token:
        raise FleetError("DIGITALOCEAN_TOKEN is not set. Fix: export DIGITALOCEAN_TOKEN=<a token "
                         "with droplet, tag and firewall scopes> (read from the environment only)")
    try:
        import pydo  # type: ignore[import-untyped]  # only `up`, `status` and `down` need it
    except ImportError:
        raise FleetError("pydo (DigitalOcean's Python client) is not installed. Fix: make setup, "
                         "or pip install pydo") from None
    endpoint = os.environ.get("DIGITALOCEAN_API_URL")
    return pydo.Client(token=token, **({"endpoint": endpoint} if endpoint else {}))


# What `fleet` reads of DigitalOcean's answers, typed: an answer without these fields, or with a
# name or address that is not one, is an error of the call that got it (and `up` removes what it
# made), never a KeyError later or a terminal escape printed.
class _Answer(BaseModel):
    model_config = ConfigDict(extra="ignore")


DropletName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,254}$")]


class _Net(_Answer):
    ip_address: IPvAnyAddress
    type: str


class _Networks(_Answer):
    v4: list[_Net] = []


class _Droplet(_Answer):
    id: int
    name: DropletName
    status: str = ""
    tags: list[str] = []
    networks: _Networks = _Networks()


class _Firewall(_Answer):
    id: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9-]{1,64}$")]
    name: DropletName


class _Vpc(_Answer):
    ip_range: Annotated[str, StringConstraints(pattern=r"^[0-9.]{7,15}/[0-9]{1,2}$")]
    region: str = ""
    default: bool = False


class _Made(_Answer):
    droplets: list[_Droplet] = Field(min_length=1)


class _DropletOne(_Answer):
    droplet: _Droplet


class _Droplets(_Answer):
    droplets: list[_Droplet] = []


class _FirewallOne(_Answer):
    firewall: _Firewall


class _Firewalls(_Answer):
    firewalls: list[_Firewall] = []


class _VpcOne(_Answer):
    vpc: _Vpc


class _Vpcs(_Answer):
    vpcs: list[_Vpc] = []


ANSWERS: dict[str, type[_Answer]] = {
    "droplets.create": _Made, "droplets.get": _DropletOne, "droplets.list": _Droplets,
    "firewalls.create": _FirewallOne, "firewalls.list": _Firewalls, "vpcs.get": _VpcOne,
    "vpcs.list": _Vpcs,
}
# a whole call, answer included: pydo's transport times each read, not an answer that trickles
API_DEADLINE_S = 30.0


class _Deadline(Exception):
    pass


def _raise_deadline(*_: object) -> None:
    raise _Deadline


def call(c: Any, method: str, **kwargs: Any) -> Any:
    """One API call within API_DEADLINE_S, its answer read through ANSWERS[method] (as plain
    data); a failure, a late or a malformed answer as FleetError with DigitalOcean's own message
    or the field that is wrong."""
    group, name = method.split(".")
    timed = threading.current_thread() is threading.main_thread()
    before = signal.signal(signal.SIGALRM, _raise_deadline) if timed else None
    try:
        if timed:
            signal.setitimer(signal.ITIMER_REAL, API_DEADLINE_S)
        got = getattr(getattr(c, group), name)(**kwargs)
    except _Deadline:
        raise FleetError(f"DigitalOcean API {method}: no whole answer within {API_DEADLINE_S:.0f} s"
                         ) from None
    except Exception as exc:  # azure.core's HttpResponseError / ServiceRequestError, and transport
        msg = getattr(getattr(exc, "response", None), "text", None)
        detail = msg() if callable(msg) else str(exc)
        detail = re.sub(r"[\x00-\x1f\x7f]", " ", detail).strip()
        if type(exc).__name__ == "DecodeError" or isinstance(exc, ValueError):
            # an answer JSON cannot read (cut short, an HTML page, a number past Python's limit)
            raise FleetError(f"DigitalOcean API {method}: an answer that is not JSON it can read "
                             f"(it began {detail[:60]!r})") from None
        raise FleetError(f"DigitalOcean API {method}: {detail[:300]}") from None
    finally:
        if timed:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, before)
    shape = ANSWERS.get(method)
    if shape is None:
        return got
    try:
        return shape.model_validate(got).model_dump(mode="json")
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(x) for x in first["loc"]) or "the answer"
        raise FleetError(f"DigitalOcean API {method}: an answer this tool cannot use ({where}: "
                         f"{first['msg']})") from None


def address(d: dict[str, Any], kind: str) -> str | None:
    return next((n["ip_address"] for n in d.get("networks", {}).get("v4", [])
                 if n.get("type") == kind), None)
