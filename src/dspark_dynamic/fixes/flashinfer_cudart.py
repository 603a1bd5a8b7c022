"""Placeholder until the FlashInfer libcudart fix lands."""


def install_from_plugin() -> None:
    return None
