"""A speaker that plays nothing: it keeps the media id it was asked to play (attribute `media_content_id`), so
the test can send `tts.speak` to it and fetch the speech HA made through `media_source/resolve_media`."""

from __future__ import annotations

from typing import Any

from homeassistant.components.media_player import (
    MediaPlayerEntity,
    MediaPlayerEntityFeature,
    MediaPlayerState,
    MediaType,
)
from homeassistant.config_entries import ConfigEntry
from homeassistant.core import HomeAssistant
from homeassistant.helpers.entity_platform import AddConfigEntryEntitiesCallback


async def async_setup_entry(
    hass: HomeAssistant, entry: ConfigEntry, add_entities: AddConfigEntryEntitiesCallback
) -> None:
    add_entities([RecordingSpeaker(entry)])


class RecordingSpeaker(MediaPlayerEntity):
    _attr_has_entity_name = True
    _attr_name = "Recording speaker"
    _attr_supported_features = MediaPlayerEntityFeature.PLAY_MEDIA
    _attr_state = MediaPlayerState.IDLE

    def __init__(self, entry: ConfigEntry) -> None:
        self._attr_unique_id = f"{entry.entry_id}-speaker"

    async def async_play_media(self, media_type: MediaType | str, media_id: str, **kwargs: Any) -> None:
        self._attr_media_content_id = media_id
        self._attr_media_content_type = media_type
        self._attr_state = MediaPlayerState.PLAYING
        self.async_write_ha_state()
