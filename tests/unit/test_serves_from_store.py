"""The "serves from the environment's store" preflight (pipelines/rollout/all_at_once.py) asks a
target again before refusing: the fleet's view can be older than the store's listing -- two first
promotions of different models into one empty store at once, the second's view read before the
first uploaded (test_postgres' two promotions at once failed on it: "its repository lists none of
the store's models")."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from pipelines.rollout.all_at_once import check_serves_from_store
from registry.errors import PromotionError

URL = "127.0.0.1:8001"


class View:
    """A fleet whose view is read once and kept until ``refresh``, over a server whose index
    ``live`` may have changed since."""

    def __init__(self, seen: set[str], live: set[str]) -> None:
        self.urls = [URL]
        self.held: dict[str, set[str]] = {URL: seen}
        self.live = live
        self.asked = 0

    def states_of(self, url: str) -> dict[str, dict[str, str]]:
        if url not in self.held:
            self.asked += 1
            self.held[url] = set(self.live)
        return {model: {"1": "READY"} for model in self.held[url]}

    def refresh(self, urls: list[str]) -> None:
        for url in urls:
            self.held.pop(url, None)


def context(fleet: View, stored: list[str], planned: str = "image_preprocess") -> Any:
    return SimpleNamespace(
        fleet=fleet,
        store=SimpleNamespace(list_models=lambda: stored, uri="s3://bucket/production"),
        plan=SimpleNamespace(steps=[SimpleNamespace(model=planned)]),
        env=SimpleNamespace(
            name="production", served_from={}, store="s3://bucket/production", local_stack=False
        ),
        options=SimpleNamespace(dry_run=False),
    )


def test_a_model_uploaded_by_another_promotion_since_the_view_was_read_is_asked_for_again() -> None:
    fleet = View(seen=set(), live={"table_data_preprocess"})  # the other promotion's upload, now listed
    check_serves_from_store(context(fleet, ["table_data_preprocess", "image_preprocess"]))
    assert fleet.asked == 1  # the target itself was asked, not the old view trusted


def test_a_target_serving_another_repository_is_still_refused_after_asking_again() -> None:
    fleet = View(seen={"elsewhere"}, live={"elsewhere"})
    with pytest.raises(PromotionError, match="lists none of the store's models \\(table_data_preprocess\\)"):
        check_serves_from_store(context(fleet, ["table_data_preprocess"]))
    assert fleet.asked == 1
