from qcli.cli import main

main()
