"""The qm.ini editor on a queue manager file shaped like the IBM report's Appendix A."""

from tasks.brokers import qmini

QM_INI = """#*******************************************************************#
#* Module Name: qm.ini                                              *#
#* Type       : IBM MQ queue manager configuration file             *#
#*******************************************************************#
ExitPath:
   ExitsDefaultPath=/var/mqm/exits
   ExitsDefaultPath64=/var/mqm/exits64
#*                                                                 *#
Log:
   LogPrimaryFiles=3
   LogSecondaryFiles=2
   LogFilePages=4096
   LogType=CIRCULAR
   LogBufferPages=0
   LogPath=/var/mqm/log/PERF0/
   LogWriteIntegrity=TripleWrite
Service:
   Name=AuthorizationService
   EntryPoints=14
   SecurityPolicy=UserExternal
ServiceComponent:
   Service=AuthorizationService
   Name=MQSeries.UNIX.auth.service
   Module=amqzfu
   ComponentDataSize=0
Channels:
   MQIBindType=FASTPATH
TCP:
   SndBuffSize=0
   RcvBuffSize=0
"""

# Appendix A.1.2 of the IBM MQ Telemetry 9.4.5 report
REPORT = {
    "Channels": {"ChlauthEarlyAdopt": "Yes", "ChlauthIgnoreUserCase": "No",
                 "MQIBindType": "FASTPATH", "MaxActiveChannels": "5000", "MaxChannels": "5000"},
    "Log": {"LogBufferPages": "4096", "LogFilePages": "16384", "LogPrimaryFiles": "16",
            "LogSecondaryFiles": "2", "LogType": "CIRCULAR", "LogWriteIntegrity": "TripleWrite"},
    "SSL": {"AllowTLSV13": "Yes", "MinimumRSAKeySize": "2048"},
    "TuningParameters": {"DefaultPQBufferSize": "50000000", "DefaultQBBufferSize": "50000000"},
}


def test_the_report_values_are_set_and_everything_else_is_kept():
    edited = qmini.set_values(QM_INI, REPORT)
    values = qmini.read_values(edited)
    for stanza, keys in REPORT.items():
        assert {k: values[stanza][k] for k in keys} == keys
    assert values["Log"]["LogPath"] == "/var/mqm/log/PERF0/"
    assert values["Service"]["SecurityPolicy"] == "UserExternal"
    original_lines = QM_INI.splitlines()
    comments = [line for line in original_lines if line.startswith("#")]
    assert [line for line in edited.splitlines() if line.startswith("#")] == comments


def test_order_of_existing_stanzas_and_keys_is_kept():
    edited = qmini.set_values(QM_INI, REPORT).splitlines()
    stanzas = [line for line in edited if line.endswith(":") and not line.startswith(" ")]
    assert stanzas[:6] == ["ExitPath:", "Log:", "Service:", "ServiceComponent:", "Channels:", "TCP:"]
    log = edited[edited.index("Log:") + 1: edited.index("Service:")]
    assert [line.split("=")[0].strip() for line in log] == [
        "LogPrimaryFiles", "LogSecondaryFiles", "LogFilePages", "LogType", "LogBufferPages",
        "LogPath", "LogWriteIntegrity"]


def test_new_keys_join_their_stanza_with_its_indentation():
    edited = qmini.set_values(QM_INI, {"Channels": {"MaxChannels": "5000"}}).splitlines()
    at = edited.index("Channels:")
    assert edited[at + 1:at + 3] == ["   MQIBindType=FASTPATH", "   MaxChannels=5000"]


def test_applying_twice_changes_nothing_more():
    once = qmini.set_values(QM_INI, REPORT)
    assert qmini.set_values(once, REPORT) == once
