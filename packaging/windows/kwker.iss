; Inno Setup script of Kwker's Windows installer: the PyInstaller one-folder app (packaging/kwker.spec)
; into Program Files, a Start menu entry, and kwker.exe on PATH. Built by `python packaging/build.py exe`
; on Windows, which passes Version and Source (the folder). Not tested here (see the README).
#ifndef Version
  #define Version "0.0.0"
#endif

[Setup]
AppId={{8C3E7A52-4F0B-4E7B-9B6F-5A1D2C3B4E5F}
AppName=Kwker
AppVersion={#Version}
AppPublisher=The Kwker authors
DefaultDirName={autopf}\Kwker
DefaultGroupName=Kwker
OutputBaseFilename=kwker-{#Version}-setup
SetupIconFile={#Source}\..\..\..\icons\kwker.ico
Compression=lzma2/ultra64
SolidCompression=yes
ArchitecturesAllowed=x64compatible
ArchitecturesInstallIn64BitMode=x64compatible
ChangesEnvironment=yes
LicenseFile={#Source}\_internal\licenses\LICENSE
UninstallDisplayIcon={app}\kwker-chat.exe

[Files]
Source: "{#Source}\*"; DestDir: "{app}"; Flags: recursesubdirs createallsubdirs ignoreversion

[Icons]
Name: "{group}\Kwker"; Filename: "{app}\kwker-chat.exe"
Name: "{autodesktop}\Kwker"; Filename: "{app}\kwker-chat.exe"; Tasks: desktopicon

[Tasks]
Name: "desktopicon"; Description: "Create a desktop icon"; Flags: unchecked

[Registry]
; kwker.exe on the user's PATH (removed again by the uninstaller)
Root: HKCU; Subkey: "Environment"; ValueType: expandsz; ValueName: "Path"; \
  ValueData: "{olddata};{app}"; Check: NeedsAddPath(ExpandConstant('{app}'))

[Code]
function NeedsAddPath(Dir: string): boolean;
var
  Path: string;
begin
  if not RegQueryStringValue(HKEY_CURRENT_USER, 'Environment', 'Path', Path) then
    Path := '';
  Result := Pos(';' + Uppercase(Dir) + ';', ';' + Uppercase(Path) + ';') = 0;
end;
