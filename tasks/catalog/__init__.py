"""What a run will do: the scenario catalog and suites, the inventory, stage expansion,
client placement, the CPUs a started broker is kept on and the max-rate search. Pure, but
for reading YAML files."""
