"""The MQTT load driver shipped to driver hosts: paho-mqtt and the standard library only."""
