"""Capacity failover: one launch tried over several zones (and accelerator types) until one grants it.

TPU capacity runs out zone by zone ("There is no more capacity in the zone"), so a launch may
name several zones (``--zone Z1,Z2`` or ``--zone any``) and other types with the same host count
(``--alternatives``). They are tried in order, one at a time, or raced: ``--race N`` keeps N
queued-resource requests waiting at once and the first one granted wins. The others are deleted
before the launch returns, and so is everything in flight when the launch fails or is
interrupted: nothing is left holding quota. Each try ends in an ``Outcome`` the launch line shows.
"""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

from tpunb.provision.gcp import apis
from tpunb import catalog, report
from tpunb.errors import ProvisionError, UsageError
from tpunb.provision.gcp import shared
from tpunb.provision.gcp.shared import ANY, PROJECT_WIDE, Candidate, Outcome
from tpunb.provision.gcp.tpu import api
from tpunb.provision.gcp import failures as gcp_errors
from tpunb.provision.gcp.config import user_region

def zones(accelerator: catalog.Accelerator, zone: str | None) -> list[str]:
    """The zones a --zone value names: Z1,Z2 in that order, or ``any`` (nearest region first)."""
    if zone is None or not zone.strip():
        return []
    if zone.strip().lower() == ANY:
        return catalog.zones_near(accelerator, user_region())
    return list(dict.fromkeys(z.strip() for z in zone.split(",") if z.strip()))


def candidates(accelerator: catalog.Accelerator, zone_list: list[str], alternatives: str | list[str] | None,
               any_zone: bool = False) -> list[Candidate]:
    """Every (type, zone) to try, ACCELERATOR's zones first, then each alternative's. A type is
    tried only in zones that offer it (``any_zone``: in every zone that does, nearest first)."""
    apis.check_tpu_api(accelerator)
    types = [accelerator] + [catalog.lookup(t) for t in _names(alternatives)]
    for alt in [t for t in types[1:] if t.planning_only or apis.no_tpu_api(t)]:  # never tried: one note, and on
        report.info(f"[tpunb] --alternatives: skipping {alt.name}, which the Cloud TPU API cannot make "
                    f"({alt.planning_only or apis.no_tpu_api(alt)})")
        types.remove(alt)
    for alt in types[1:]:
        if alt.hosts != accelerator.hosts:
            raise UsageError(f"--alternatives {alt.name} has {alt.hosts} host{'s' if alt.hosts > 1 else ''}, "
                             f"{accelerator.name} has {accelerator.hosts}: name types with {accelerator.hosts} "
                             f"host{'s' if accelerator.hosts > 1 else ''} (a notebook's code expects that many)")
    found = []
    for acc in types:
        places = catalog.zones_near(acc, user_region()) if any_zone else zone_list
        found += [Candidate(acc.name, z) for z in places if z in acc.zones]
    if not found and len(zone_list) == 1:
        catalog.check_zone(accelerator, zone_list[0])  # the one-line error naming zones that do offer it
    if not found:
        what = " or ".join(t.name for t in types)
        raise ProvisionError(f"{what} is offered in none of {', '.join(zone_list)}: zones with {accelerator.name}: "
                             f"{', '.join(accelerator.zones)} (or --zone any)")
    return list(dict.fromkeys(found))


def _names(alternatives: str | list[str] | None) -> list[str]:
    if not alternatives:
        return []
    items = alternatives.split(",") if isinstance(alternatives, str) else alternatives
    return [a.strip() for a in items if a.strip()]


class Search:
    """Tries ``spec`` at each candidate, ``width`` at a time, until one is granted.

    ``on_state(text, elapsed)`` hears each try's states and outcomes, prefixed by its place."""

    def __init__(self, spec: api.NodeSpec, places: list[Candidate], width: int = 1,
                 on_state: Callable[[str, float], Any] | None = None,
                 timeout: float | None = shared.DEFAULT_TIMEOUT) -> None:
        self.spec, self.places, self.width = spec, places, max(1, width)
        self.on_state, self.timeout = on_state, timeout
        self.outcomes: list[Outcome] = []
        self.started = time.monotonic()
        #: the attempt granted, from the moment it is seen until what launched it is done with it:
        #: deleted by ``run`` if anything stops it before it returns, by ``undo`` after
        self.granted: api.Attempt | None = None

    def run(self) -> tuple[api.NodeInfo, api.NodeSpec]:
        """The first node granted and the spec that made it; a ProvisionError with one line per
        place when none is. Whatever is still in flight when this returns or raises is deleted."""
        waiting, running = list(self.places), {}
        delays = shared.poll_delays()
        try:
            while waiting or running:
                self._start(waiting, running)
                for place, attempt in list(running.items()):
                    try:
                        info = attempt.poll()
                    except ProvisionError as e:
                        del running[place]
                        self._failed(place, e, waiting)
                        continue
                    if info is not None:
                        self.granted = attempt  # before it leaves ``running``: whatever comes, it is deleted
                        del running[place]
                        self._say(Outcome(place, "granted"))
                        self._cancel(running, "another zone was granted first")
                        return info, attempt.spec
                if running:
                    shared.pause(min([next(delays)] + [a.time_left() for a in running.values()]))
        except BaseException as e:
            why = "its launch was interrupted" if isinstance(e, KeyboardInterrupt) else "its launch failed"
            self._cancel(running, why)
            self.undo(why)  # stopped after a zone granted it (the losers being deleted): the winner goes too
            raise
        raise self.everywhere_failed()

    def undo(self, why: str) -> str:
        """Delete the granted node (what launched it failed or was interrupted after ``run`` saw it):
        "" when nothing of it is left, else what is ("; could not delete ...", said above as well)."""
        granted, self.granted = self.granted, None
        note = granted.cancel(why) if granted is not None else ""
        return f"; {note}" if note.startswith("could not delete") else ""

    def _start(self, waiting: list[Candidate], running: dict) -> None:
        """Start tries until ``width`` are in flight; never two in one zone (they share the name)."""
        busy = {p.zone for p in running}
        for place in list(waiting):
            if len(running) >= self.width:
                return
            if place.zone in busy or place not in waiting:  # a failure may have ruled it out meanwhile
                continue
            waiting.remove(place)
            spec = dataclasses.replace(self.spec, zone=place.zone, accelerator=place.accelerator)
            try:
                running[place] = api.Attempt(spec, self._prefixed(place), self.timeout)
            except ProvisionError as e:
                self._failed(place, e, waiting)
                continue
            busy.add(place.zone)

    def _failed(self, place: Candidate, error: ProvisionError, waiting: list[Candidate]) -> None:
        if len(self.places) == 1 or error.reason in PROJECT_WIDE:
            raise error  # one place: its own message says it best; project-wide: no zone will do
        self._say(Outcome(place, error.reason or "other", str(error)))
        region = gcp_errors.quota_region(str(error)) if error.reason == "quota" else None
        if region:  # quotas are regional, per generation: the region's other zones would fail the same way
            generation = catalog.lookup(place.accelerator).generation
            for other in [c for c in waiting if catalog.region_of(c.zone) == region
                          and catalog.lookup(c.accelerator).generation == generation]:
                waiting.remove(other)
                self._say(Outcome(other, "skipped", f"the {generation} quota of {region} is exhausted"))

    def _cancel(self, running: dict, why: str) -> None:
        for place, attempt in list(running.items()):
            attempt.cancel(why)
            del running[place]
            self.outcomes.append(Outcome(place, "cancelled", attempt.state or ""))

    def _say(self, outcome: Outcome) -> None:
        self.outcomes.append(outcome)
        if self.on_state is not None and len(self.places) > 1:
            self.on_state(str(outcome), time.monotonic() - self.started)

    def _prefixed(self, place: Candidate) -> Callable[[str, float], Any] | None:
        if self.on_state is None or len(self.places) == 1:
            return self.on_state
        return lambda state, _: self.on_state(f"{place}: {state}", time.monotonic() - self.started)

    def summary(self) -> str:
        """Per place what happened, for the launch line: 'us-east5-a v5p-8: no capacity; ...'."""
        order = sorted(self.outcomes, key=lambda o: self.places.index(o.candidate))
        return "; ".join(str(o) for o in order)

    def everywhere_failed(self) -> ProvisionError:
        """One line per place, then one line saying what to try."""
        kinds = {o.kind for o in self.outcomes}
        lines = [f"{self.spec.name} was granted nowhere ({len(self.outcomes)} tries):"]  # none was cancelled
        lines += [f"  {o}" for o in self.outcomes]
        lines.append(f"try: {advice(kinds, self.spec)}")
        reason = kinds.pop() if len(kinds) == 1 else "failover"
        return ProvisionError("\n".join(lines), reason)


def advice(kinds: set[str], spec: api.NodeSpec) -> str:
    """What to try after every place failed, most useful first."""
    tips = []
    if kinds & {"no_capacity", "timeout", "preempted"}:
        if not spec.queued:
            tips.append("--queued --race 3 to wait for capacity in 3 zones at once")
        if not spec.spot:
            tips.append("--spot")
        tips.append("more zones (--zone any) or types (--alternatives)")
    if "quota" in kinds:
        tips.append(f"more quota (https://console.cloud.google.com/iam-admin/quotas?project={spec.project})")
    if "permission" in kinds:
        tips.append("roles/tpu.admin where permission was denied")
    return "; ".join(tips) or "%tpu_doctor to check the project, then retry"
