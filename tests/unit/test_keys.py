import pytest

from funnel.common.keys import Keys


def test_key_names_are_readable():
    keys = Keys("funnel")
    assert keys.queue("text-embedding") == "funnel:queue:text-embedding"
    assert keys.reply("ab12") == "funnel:reply:ab12"
    assert keys.inflight("w1") == "funnel:inflight:w1"
    assert keys.worker("w1") == "funnel:worker:w1"
    assert keys.dead("m") == "funnel:dead:m"


@pytest.mark.parametrize("name", ["", "a b", "a:b", "../x", "*", "x" * 65, "-lead"])
def test_unsafe_names_never_become_keys(name):
    with pytest.raises(ValueError):
        Keys().queue(name)


def test_reply_keys_are_recognised():
    keys = Keys("funnel")
    assert keys.is_reply("funnel:reply:abc")
    assert not keys.is_reply("funnel:queue:abc")
    assert not keys.is_reply("other:reply:abc")
    assert not keys.is_reply("funnel:reply:a:b")
