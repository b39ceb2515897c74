"""Package metadata read from settings.ini (the nbdev 2 convention)."""
from configparser import ConfigParser
from pathlib import Path

import setuptools

here = Path(__file__).parent
cfg = ConfigParser(delimiters=["="])
cfg.read(here / "settings.ini", encoding="utf-8")
cfg = cfg["DEFAULT"]

licenses = {"apache2": "Apache-2.0"}  # SPDX expression
statuses = ["1 - Planning", "2 - Pre-Alpha", "3 - Alpha", "4 - Beta", "5 - Production/Stable"]

setuptools.setup(
    name=cfg["lib_name"],
    version=cfg["version"],
    description=cfg["description"],
    long_description=(here / "README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    author=cfg["author"],
    author_email=cfg["author_email"],
    license=licenses[cfg["license"]],
    url=cfg["git_url"],
    keywords=cfg["keywords"].split(),
    classifiers=[
        "Development Status :: " + statuses[int(cfg["status"])],
        "Intended Audience :: " + cfg["audience"],
        "Natural Language :: " + cfg["language"],
        "Programming Language :: Python :: 3",
    ],
    packages=setuptools.find_packages(include=[cfg["lib_path"], cfg["lib_path"] + ".*"]),
    include_package_data=True,
    python_requires=">=" + cfg["min_python"],
    install_requires=cfg["requirements"].split(),
    extras_require={"dev": cfg["dev_requirements"].split()},
    entry_points={"console_scripts": cfg["console_scripts"].split()},
    zip_safe=False,
)
