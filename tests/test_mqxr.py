"""MQXR heap commands (IBM MQ itself cannot run here: these are checked on their text)."""

import pytest

from tasks.brokers.mqxr import heap_commands, with_heap

DEFAULT = '-m +QMNAME+ -d "+MQ_Q_MGR_DATA_PATH+" -g "+MQ_DATA_PATH+" -sf "[DEFAULT]"'


def test_the_report_heap_is_added_to_the_startarg():
    assert with_heap(DEFAULT, "4096M", "4096M") == DEFAULT + ' -J "-Xms4096M" -J "-Xmx4096M"'


def test_an_existing_heap_is_replaced_not_repeated():
    once = with_heap(DEFAULT, "1024M", "2048M")
    assert with_heap(once, "4096M", "4096M").count("-Xm") == 2
    assert with_heap(with_heap(once, "4G", "4G"), "4G", "4G") == with_heap(once, "4G", "4G")


def test_commands_stop_alter_start_and_quote_for_mqsc():
    commands = heap_commands("-sf 'x'", "4096M", "4096M")
    assert commands[0] == "STOP SERVICE(SYSTEM.MQXR.SERVICE)"
    assert commands[1] == ("ALTER SERVICE(SYSTEM.MQXR.SERVICE) STARTARG('-sf ''x'' "
                           "-J \"-Xms4096M\" -J \"-Xmx4096M\"')")
    assert commands[2] == "START SERVICE(SYSTEM.MQXR.SERVICE)"


@pytest.mark.parametrize("size", ["4096", "4096MB", "1G; rm", "$(id)"])
def test_bad_sizes_are_rejected(size):
    with pytest.raises(ValueError, match="heap size"):
        with_heap(DEFAULT, size, "4G")


def test_activemq_options_keep_other_flags_and_replace_the_heap():
    from tasks.brokers.activemq import heap_options, with_heap

    packaged = '# comment\nACTIVEMQ_OPTS="-Xms512M -Xmx512M -Dorg.apache.activemq.UseDedicatedTaskRunner=true"\n'
    tuned = with_heap(packaged, "256M", "256M")
    assert tuned.startswith("# comment\n")
    assert heap_options(tuned) == ["-Xms256M", "-Xmx256M"]
    assert "UseDedicatedTaskRunner=true" in tuned
    assert with_heap(tuned, "256M", "256M") == tuned
    assert heap_options(None) == ["-Xms512M", "-Xmx512M"]  # the package default


def test_activemq_options_keep_a_quoted_option_quoted():
    import shlex

    from tasks.brokers.activemq import _OPTS_LINE, with_heap

    kept = "-Dsun.net.client.defaultReadTimeout=5000 -Djava.ext.note='two words' -Xss1M"
    tuned = with_heap(f'ACTIVEMQ_OPTS="-Xmx1G {kept} -Xms1G"\n', "256M", "256M")
    assert tuned == f'ACTIVEMQ_OPTS="-Xms256M -Xmx256M {kept}"\n'
    # what the start script's shell makes of it: the quoted option is one word still
    assert shlex.split(_OPTS_LINE.search(tuned)["opts"])[3] == "-Djava.ext.note=two words"
