"""``structural.slots``: the public slot types, apart from the unit policy."""

from __future__ import annotations


def test_the_slot_types_are_public_and_the_unit_policy_lives_apart_from_the_mask():
    import avalanche_plugins.structural.masks as masks_module
    from avalanche_plugins.structural import interventions, scores, selection, slots

    assert masks_module._Slot is slots.Slot and masks_module._Layer is slots.MaskedLayer  # old pickles load
    assert scores.lowest_active is selection.lowest_active and scores.highest_masked is selection.highest_masked
    assert interventions.reinit_rows.__annotations__["layer"] in ("MaskedLayer", slots.MaskedLayer)
