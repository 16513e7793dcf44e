"""The ground floor: the domain vocabulary every other package of fairgate speaks.

Plain records and pure parsers with no fairgate import (an import-linter contract holds it):
connections and their wires, client keys, OAuth token sets, breaker states, the units and windows
quota is counted in, the providers' rate-limit readings and the one parser of retry times.
"""
